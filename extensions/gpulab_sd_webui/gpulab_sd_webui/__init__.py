"""gpulab's small Stable Diffusion web UI: a diffusers StableDiffusionPipeline behind
AUTOMATIC1111's ``/sdapi/v1`` API subset, run by jupyter-server-proxy in a user's server.

Importing this package imports neither torch nor diffusers (the app loads them in the background).
"""

__version__ = "0.1.0"
