"""The catalog mapped onto zero-to-jupyterhub and KubeSpawner (profiles, pod overrides): on paper."""
