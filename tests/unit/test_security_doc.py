"""docs/security.md is the map of what a user can reach: every route gpulab mounts (in the hub,
in billing, in every user's server) has a row there with its threat, its defence and the test that
proves it. These tests keep the map current: a new route without a row, or a row naming a test
that no longer exists, fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from harness import REPO

DOC = REPO / "docs" / "security.md"


def _hub_routes() -> list[str]:
    from nativeauthenticator import NativeAuthenticator

    from gpulab.hub_config import plugin
    from gpulab.hub_config.courses import lti

    native = [p for p, *_ in NativeAuthenticator.get_handlers(None, None)]
    return [
        *(p for p, *_ in plugin.routes()),
        lti.LOGIN_PATH,
        lti.LAUNCH_PATH,
        *native,
    ]


def _billing_routes() -> list[str]:
    from gpulab.billing_service.app import BillingService

    service = BillingService()
    service.prefix = "/"
    app = service.make_app()
    patterns = [r.matcher.regex.pattern for r in app.default_router.rules[0].target.rules]
    return sorted({"/" + p.lstrip("/").removesuffix("$") for p in patterns})


def _server_routes() -> list[str]:
    """The routes gpulab's extensions add to every user server: read from their sources (they
    are registered at server start with the server's base URL, which a test has no need of)."""
    out = []
    sources = [
        REPO / "extensions/jupyterlab_gpulab/jupyterlab_gpulab/handlers.py",
        *sorted((REPO / "extensions/gpulab_reporter/gpulab_reporter").glob("*.py")),
    ]
    for path in sources:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", "")) == "url_path_join"
                and len(node.args) == 2
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "base"
                and isinstance(node.args[1], ast.Constant)
            ):
                out.append(f"/gpulab/api/{node.args[1].value}")
    return out


def _documented() -> str:
    return DOC.read_text()


def test_every_hub_and_billing_route_has_a_row():
    doc = _documented()
    missing = [r for r in _hub_routes() if f"`{r}`" not in doc]
    missing += [f"billing {r}" for r in _billing_routes() if f"`{r}`" not in doc]
    assert not missing, f"routes without a row in docs/security.md: {missing}"


def test_every_route_inside_user_servers_has_a_row():
    routes = _server_routes()
    assert len(routes) >= 5, routes  # the parser still finds the extension's routes
    doc = _documented()
    missing = [r for r in routes if f"`{r}`" not in doc]
    assert not missing, f"server routes without a row in docs/security.md: {missing}"


def test_every_test_the_map_names_exists():
    doc = _documented()
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", doc)
    assert len(named) >= 20, "docs/security.md names the tests that prove each defence"
    missing = []
    for path, name in named:
        file = REPO / path
        if not file.exists():
            missing.append(path)
        elif name and not re.search(rf"^(async )?def {name}\b", file.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"


def test_every_row_names_a_threat_a_defence_and_a_test():
    rows = [
        line
        for line in _documented().splitlines()
        if line.startswith("| `") and not line.startswith("| ---")
    ]
    assert rows
    thin = [r for r in rows if r.count("|") < 5 or "tests/" not in r]
    assert not thin, f"rows without threat, defence and test: {thin[:5]}"


def test_the_map_lists_the_paths_a_user_controls():
    doc = _documented()
    for path in ("~/datasets", "~/models", "spool", "exchange", "cgroup"):
        assert path in doc, f"docs/security.md says nothing of {path}"


def test_this_file_is_what_the_doc_says_keeps_it_current():
    assert Path(__file__).name in _documented()
