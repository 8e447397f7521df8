# Serve the Stable Diffusion WebUI through jupyter-server-proxy: started on first visit of
# /user/NAME/sd-webui/ (or from the JupyterLab launcher), behind the hub's authentication.
c = get_config()  # noqa: F821 (`get_config` is injected by Jupyter)
c.ServerProxy.servers = {
    "sd-webui": {
        "command": ["start-sd-webui", "{port}", "{base_url}sd-webui"],
        # Model loading takes a while on first start.
        "timeout": 300,
        "absolute_url": True,
        "launcher_entry": {"title": "Stable Diffusion WebUI"},
    }
}
