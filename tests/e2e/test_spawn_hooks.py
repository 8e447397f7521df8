"""JupyterHub's standard spawn hooks, set by a deployment after ``configure(c)``, work on gpulab:
``Spawner.options_from_form`` and ``Spawner.apply_user_options`` as JupyterHub's own named-server
tests set them (their ``FormSpawner``: the form's fields become options of the deployment's own,
``"notspecified": 5`` added, applied by the deployment's hook). The start then runs, with
gpulab's defaults for the gpulab fields the options do not name; a bad gpulab field is a 400
naming it, never a 500 from the start."""

from __future__ import annotations

from pathlib import Path

from harness import ConfigFileHub, wait_for
from test_jupyterhub_config_file import CONFIG, AdminBrowser

HOOKS = """
def energy_form(form_data):
    # JupyterHub's FormSpawner.options_from_form (jupyterhub/tests/mocking.py), as a deployment's callable.
    options = {"notspecified": 5}
    if "bounds" in form_data:
        options["bounds"] = [int(i) for i in form_data["bounds"]]
    for field in ("energy", "gpu", "gpus"):
        if field in form_data:
            options[field] = form_data[field][0]
    return options


def apply_energy(spawner, user_options):
    spawner.environment = {**spawner.environment, "ENERGY": str(user_options.get("energy", ""))}
    with open(APPLIED, "a") as f:
        f.write(str(user_options.get("energy")) + "\\n")


c.Spawner.options_from_form = energy_form
c.Spawner.apply_user_options = apply_energy
"""


def hooks(applied: Path) -> str:
    return f"APPLIED = {str(applied)!r}\n" + HOOKS


def start_hub(tmp_path: Path, config_text: str) -> ConfigFileHub:
    config = tmp_path / "site" / "jupyterhub_config.py"
    config.parent.mkdir()
    config.write_text(config_text)
    env = {"GPULAB_SIMULATE_GPUS": "A100-80G:1"}
    return ConfigFileHub(tmp_path / "data", config, env=env).start()


def test_deployment_form_and_apply_hooks_start_servers(tmp_path: Path, chp_installed) -> None:
    applied = tmp_path / "applied"
    hub = start_hub(tmp_path, CONFIG + hooks(applied))
    try:
        admin = AdminBrowser(hub)
        # The spawn form's POST, through the deployment's options_from_form.
        r = admin.web.post(
            "/hub/spawn/admin", [("energy", "511keV"), ("bounds", "-1"), ("bounds", "1")]
        )
        assert r.ok, r.text[-2000:]
        server = wait_for(
            lambda: (s := admin.server()) and s["ready"] and s, 90, what="admin's server"
        )
        assert server["user_options"] == {"notspecified": 5, "bounds": [-1, 1], "energy": "511keV"}
        # The deployment's hook applied its option; gpulab's defaults for what it did not name.
        assert applied.read_text() == "511keV\n"
        assert server["state"]["options"]["gpu"] == "none"
        assert server["state"]["mode_label"] == "No GPU"
        assert admin.web.get("/user/admin/lab").ok
        admin.stop_server()

        # The REST API: the deployment's options next to a gpulab field.
        r = admin.web.http.post(
            f"{hub.url}/hub/api/users/admin/server",
            json={"energy": "938MeV", "gpu": "a100-80g"},
            headers=admin.xsrf,
            timeout=60,
        )
        assert r.status_code in (201, 202), r.text
        server = wait_for(
            lambda: (s := admin.server()) and s["ready"] and s, 90, what="admin's server"
        )
        assert applied.read_text() == "511keV\n938MeV\n"
        assert server["state"]["options"]["gpu"] == "a100-80g"
        assert server["state"]["allocation"]["gpu_type"] == "a100-80g"
        admin.stop_server()

        # A bad gpulab field is the user's error, named: 400, not the start's 500.
        r = admin.web.http.post(
            f"{hub.url}/hub/api/users/admin/server",
            json={"energy": "1eV", "gpu": "tpu-v5"},
            headers=admin.xsrf,
            timeout=60,
        )
        assert r.status_code == 400, r.text
        assert "gpu:" in r.json()["message"] and "a100-80g" in r.json()["message"]
        assert admin.server() is None
    finally:
        hub.stop()


def test_deployment_form_hook_alone_is_a_400_naming_the_field(
    tmp_path: Path, chp_installed
) -> None:
    """With gpulab's own apply_user_options every option is gpulab's: a deployment's form that
    makes options gpulab does not know gets a 400 naming the field, never a 500."""
    applied = tmp_path / "applied"
    hub = start_hub(
        tmp_path, CONFIG + hooks(applied).replace("c.Spawner.apply_user_options", "_ignored")
    )
    try:
        admin = AdminBrowser(hub)
        r = admin.web.post("/hub/spawn/admin", [("energy", "511keV")])
        assert r.status_code == 400, r.text[-2000:]
        # The form is a page for people: the plain sentence, naming the field (the API's
        # "Invalid spawn option energy: unknown field" is for JSON clients).
        assert "“energy” is not a server option this hub knows" in r.content.decode()
        assert "Unhandled error" not in r.text
        assert admin.server() is None
    finally:
        hub.stop()
