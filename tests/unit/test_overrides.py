"""Upgrade canaries for gpulab's overrides of JupyterHub (hub_config/overrides/, plugin.py).

gpulab changes two JupyterHub handlers by subclassing them and mounting the subclasses ahead of
JupyterHub's own routes for the same URLs, through the authenticator's ``get_handlers``. Each test
here fails when a JupyterHub upgrade moves something that relies on: a method signature, a route
pattern, the order in which the hub mounts routes, or an attribute JupyterHub itself uses.
"""

from __future__ import annotations

import inspect
import re

from jupyterhub import apihandlers, handlers
from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.app import JupyterHub
from jupyterhub.handlers.pages import SpawnHandler
from jupyterhub.spawner import Spawner

from gpulab.hub_config import plugin
from gpulab.hub_config.overrides.server_api import ServerAPIHandler
from gpulab.hub_config.overrides.spawn_page import SpawnPageHandler


def params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_the_spawn_page_methods_gpulab_overrides_keep_their_signatures() -> None:
    assert params(SpawnHandler._wrap_spawn_single_user) == [
        "self",
        "user",
        "server_name",
        "display_name",
        "spawner",
        "pending_url",
        "options",
    ]
    assert params(inspect.unwrap(SpawnHandler._post)) == [
        "self",
        "user_name",
        "server_name",
        "display_name",
    ]
    assert params(inspect.unwrap(UserServerAPIHandler.post)) == ["self", "user_name", "server_name"]
    assert params(inspect.unwrap(UserServerAPIHandler.delete)) == [
        "self",
        "user_name",
        "server_name",
    ]


def test_jupyterhub_still_clears_a_failed_spawn_future_on_an_explicit_request() -> None:
    # SpawnPageHandler repeats this first step of JupyterHub's own _wrap_spawn_single_user.
    source = inspect.getsource(SpawnHandler._wrap_spawn_single_user)
    assert "spawner._spawn_future = None" in source
    assert "_spawn_future" in vars(Spawner) or hasattr(Spawner, "_spawn_future")


def _default_routes() -> dict[str, type]:
    return {
        pattern: handler
        for pattern, handler, *_ in [*handlers.default_handlers, *apihandlers.default_handlers]
    }


def test_every_override_shadows_the_jupyterhub_route_it_replaces() -> None:
    defaults = _default_routes()
    overrides = {
        pattern: handler
        for pattern, handler in plugin.routes()
        if handler in (SpawnPageHandler, ServerAPIHandler)
    }
    assert len(overrides) == 5
    for pattern, handler in overrides.items():
        assert pattern in defaults, f"JupyterHub no longer routes {pattern}"
        assert issubclass(handler, defaults[pattern]), (pattern, defaults[pattern])


# Issue 23's storage resources, which its contract puts beside JupyterHub's own per-user API
# (/hub/api/users/NAME/...) and its storage list at /hub/api/storage: allowed outside
# /api/gpulab/ as long as no JupyterHub route answers any of their paths (checked below).
BESIDE_JUPYTERHUB = re.compile(
    r"/api/users/\(\[\^/\]\+\)/(storage|datasets|uploads)(/.*)?|/api/storage|/upload/\?"
)


def test_gpulab_api_routes_do_not_collide_with_jupyterhubs() -> None:
    defaults = _default_routes()
    for pattern, handler in plugin.routes():
        if handler in (SpawnPageHandler, ServerAPIHandler):
            continue
        assert pattern not in defaults, pattern
        if BESIDE_JUPYTERHUB.fullmatch(pattern):
            # A path of it (each group filled in) is answered by no JupyterHub route.
            sample = re.sub(r"\(\[\^/\]\+\)|\([^)]*\)", "x0", pattern).replace("/?", "")
            hits = [d for d in defaults if re.fullmatch(d.rstrip("$"), sample)]
            assert not hits, (pattern, hits)
            continue
        # gpulab's own API under /api/gpulab/, its own pages (the teacher dashboard) /gpulab/.
        assert re.fullmatch(r"/(api/)?gpulab/.*", pattern), pattern


def test_the_hub_mounts_the_authenticators_routes_ahead_of_its_own() -> None:
    source = inspect.getsource(JupyterHub.init_handlers)
    auth = source.index("self.authenticator.get_handlers(self)")
    assert auth < source.index("handlers.default_handlers")
    assert auth < source.index("apihandlers.default_handlers")


def test_the_hub_restores_spawners_before_it_listens() -> None:
    # attach() waits for the hub's API to answer before the first orphan sweep: that is only
    # safe while init_spawners runs in initialize(), before start() listens.
    init = inspect.getsource(JupyterHub.initialize)
    assert "self.init_spawners()" in init
    assert "init_spawners_timeout" in init


def test_the_spawn_page_get_gpulab_overrides_still_reads_options_from_the_query() -> None:
    # SpawnPageHandler._get takes the options out of request.query_arguments (so JupyterHub's
    # _get renders the form instead of spawning) and hands them to the form via spawner.handler.
    assert params(inspect.unwrap(SpawnHandler._get)) == [
        "self",
        "user_name",
        "server_name",
        "display_name",
    ]
    source = inspect.getsource(inspect.unwrap(SpawnHandler._get))
    assert "self.request.query_arguments.items()" in source
    assert "spawner.handler = self" in source
    assert "options_from_query" in source


def test_the_job_server_guard_still_sits_where_jupyterhub_checks_named_servers() -> None:
    """Issue 26: ServerAPIHandler lets the platform start and stop ``job-*`` servers where named
    servers are off by answering ``allow_named_servers`` itself and by calling JupyterHub's
    ``_check_named_server_request`` without the named-server limit; it refuses a user's start,
    creation or rename (post, put, patch) before JupyterHub's own. Each relies on these."""
    assert params(inspect.unwrap(UserServerAPIHandler.put)) == ["self", "user_name", "server_name"]
    assert params(inspect.unwrap(UserServerAPIHandler.patch)) == [
        "self",
        "user_name",
        "server_name",
    ]
    assert params(UserServerAPIHandler._check_named_server_request) == [
        "self",
        "user",
        "server_name",
        "display_name",
        "check_limit",
    ]
    check = inspect.getsource(UserServerAPIHandler._check_named_server_request)
    assert "self.allow_named_servers" in check and "check_limit" in check
    assert "self.allow_named_servers" in inspect.getsource(UserServerAPIHandler.delete)
    assert isinstance(inspect.getattr_static(ServerAPIHandler, "allow_named_servers"), property)
    for method in ("post", "put", "patch"):
        assert "refuse_job_server" in inspect.getsource(getattr(ServerAPIHandler, method))
