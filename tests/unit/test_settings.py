"""The settings table (gpulab.catalog.settings): every GPULAB_* name declared once, parsed and
checked in one place, shown by `gpulab config`, and the README's table generated from it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gpulab.catalog import settings
from gpulab.hub_config.cli.main import build_parser, main
from gpulab.hub_config.config import Settings

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bGPULAB_[A-Z0-9_]*[A-Z0-9]\b")
# Not environment variables: Python names in the nbgrader config a spawner writes into each
# server (spawners/local/exchange.py).
NOT_ENVIRONMENT = {"GPULAB_EXCHANGE", "GPULAB_COURSE", "GPULAB_COURSE_DIRS", "GPULAB_STUDENT_ID"}
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", "artifacts", ".pytest_cache"}


def tree_files():
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for f in files:
            if f in ("package-lock.json",) or f.endswith((".png", ".svg", ".sqlite", ".pyc")):
                continue
            yield Path(folder) / f


def test_every_gpulab_name_in_the_tree_is_declared() -> None:
    """Code, deployment files, scripts and docs name no GPULAB_* variable the table lacks."""
    found: dict[str, str] = {}
    for path in tree_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if path == Path(__file__):
            continue  # names undeclared ones on purpose
        for name in NAME.findall(text):
            found.setdefault(name, str(path.relative_to(ROOT)))
    missing = {
        n: where
        for n, where in found.items()
        if n not in settings.SETTINGS and n not in NOT_ENVIRONMENT
    }
    assert missing == {}, "declare these in catalog/settings.py (operator, internal or test)"
    assert "GPULAB_PORT" in found and "GPULAB_RUN_AS" in found  # the scan sees code


def test_operator_settings_are_read_only_through_the_table() -> None:
    """Outside the table and code run inside a user's server, gpulab reads no operator setting
    from the environment itself (internal hand-overs may be read where they are handed over)."""
    # env.get("X"), environ["X"] (but not env["X"] = ..., a hand-over written).
    read = re.compile(
        r"""(?:environ|env)(?:\.get\(\s*["'](GPULAB_\w+)|\[\s*["'](GPULAB_\w+)["']\](?!\s*=[^=]))"""
    )
    offenders = []
    for top in ("catalog", "hub_config", "billing_service", "spawners"):
        for path in (ROOT / top).rglob("*.py"):
            if path == ROOT / "catalog" / "settings.py" or "inside" in path.parts:
                continue
            for name in (a or b for a, b in read.findall(path.read_text(encoding="utf-8"))):
                if settings.setting(name).scope == "operator":
                    offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []


def test_readme_table_is_the_generated_one() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert settings.replace_markdown(readme) == readme, (
        "README's settings table differs from catalog/settings.py: run "
        "`.venv/bin/python -m gpulab.catalog.settings README.md`"
    )


def test_declarations_are_complete() -> None:
    counts = {scope: 0 for scope in settings.SCOPES}
    for s in settings.TABLE:
        counts[s.scope] += 1
        assert s.name.startswith("GPULAB_") and s.help and s.group, s
        assert s.kind != "choice" or s.default in s.choices, s
        if s.default is not None and s.default != () and s.kind != "str":
            # The default survives a round trip through the environment.
            assert s.parse(s.text(s.default)) == s.default, s
    assert counts["operator"] >= 40 and counts["internal"] >= 25 and counts["test"] >= 5


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("GPULAB_PORT", "80a", "GPULAB_PORT: '80a' is not allowed; expected a port 1-65535"),
        ("GPULAB_PORT", "0", "expected a port 1-65535"),
        (
            "GPULAB_OPEN_SIGNUP",
            "maybe",
            "GPULAB_OPEN_SIGNUP: 'maybe' is not allowed; expected 1 or 0",
        ),
        (
            "GPULAB_SPAWNER",
            "k8s",
            "GPULAB_SPAWNER: 'k8s' is not allowed; expected one of local, docker, swarm",
        ),
        ("GPULAB_BILLING_MIN_MINUTES", "-1", "expected a number >= 0"),
        ("GPULAB_BILLING_EXTERNAL_URL", "http://b:1/x", "HOST[:PORT] URL with no path"),
        ("GPULAB_BILLING_SERVER_URL", "proxy:8000/x", "expected an http(s) URL"),
        ("GPULAB_SWARM_NODE_ENGINES", '["a"]', "not an object of strings"),
        ("GPULAB_SWARM_NODE_ENGINES", "{", "not valid JSON"),
        ("GPULAB_BILLING_ARGS", "'open", "expected shell-quoted arguments"),
    ],
)
def test_a_bad_value_names_the_variable_and_what_is_allowed(name, value, expected) -> None:
    with pytest.raises(settings.SettingError, match=re.escape(expected)) as e:
        settings.get(name, {name: value})
    assert str(e.value).startswith(f"{name}: ")
    assert any(m.startswith(f"{name}: ") for m in settings.problems({name: value}))


def test_values_parse_to_their_types() -> None:
    env = {
        "GPULAB_PORT": " 9000 ",
        "GPULAB_OPEN_SIGNUP": "yes",
        "GPULAB_BILLING": "0",
        "GPULAB_LTI_CLIENT_IDS": "a, b,,",
        "GPULAB_BILLING_ARGS": "--BillingService.idle_timeout=5 '--x=a b'",
        "GPULAB_HUB_PORT": "",  # empty: the default, for every type but text
        "GPULAB_IP": "",  # text: empty is a value
    }
    assert settings.get("GPULAB_PORT", env) == 9000
    assert settings.get("GPULAB_OPEN_SIGNUP", env) is True
    assert settings.get("GPULAB_BILLING", env) is False
    assert settings.get("GPULAB_LTI_CLIENT_IDS", env) == ("a", "b")
    assert settings.get("GPULAB_BILLING_ARGS", env) == [
        "--BillingService.idle_timeout=5",
        "--x=a b",
    ]
    assert settings.get("GPULAB_HUB_PORT", env) == 8081
    assert settings.get("GPULAB_IP", env) == ""
    assert settings.get("GPULAB_IP", {}) == "127.0.0.1"
    with pytest.raises(KeyError, match="not declared"):
        settings.get("GPULAB_NOPE", {})


def test_the_hub_reads_its_settings_through_the_table() -> None:
    s = Settings.from_env({"GPULAB_PORT": "9001", "GPULAB_OPEN_SIGNUP": "1"})
    assert (s.port, s.open_signup, s.hub_port, s.spawner) == (9001, True, 8081, "local")
    assert Settings.from_env({}).simulate_gpus == ""  # `gpulab up` resolves "auto"
    with pytest.raises(SystemExit, match="GPULAB_HUB_PORT: 'x' is not allowed"):
        Settings.from_env({"GPULAB_HUB_PORT": "x"})
    with pytest.raises(SystemExit, match="GPULAB_SPAWNER: 'k8s' is not allowed"):
        Settings.from_env({"GPULAB_SPAWNER": "k8s"})


def test_up_flags_are_the_tables() -> None:
    sub = build_parser()._subparsers._group_actions[0].choices
    flags = {o for a in sub["up"]._actions for o in a.option_strings} - {"-h", "--help"}
    assert flags == {s.flag for s in settings.TABLE if s.flag}
    port = next(a for a in sub["up"]._actions if "--port" in a.option_strings)
    assert port.help == (
        "port browsers connect to: the proxy's public port (default 8000) [env GPULAB_PORT]"
    )


def test_up_refuses_a_bad_variable_before_starting_anything(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("GPULAB_PROXY_API_PORT", "99999")
    assert main(["up", "--data-dir", str(tmp_path / "d")]) == 2
    assert "gpulab: GPULAB_PROXY_API_PORT: '99999' is not allowed" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
    with pytest.raises(SystemExit):
        main(["up", "--port", "http"])
    assert "argument --port: 'http' is not allowed; expected a port" in capsys.readouterr().err


def config_output(monkeypatch, capsys, env: dict, *args: str) -> tuple[int, dict, str]:
    for k in [k for k in os.environ if k.startswith("GPULAB_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc = main(["config", *args])
    out, err = capsys.readouterr()
    rows = {}
    for line in out.splitlines():
        if line.startswith("  GPULAB_"):
            name, rest = line.strip().split(None, 1)
            rows[name] = rest
    return rc, rows, out + err


def test_config_says_where_each_value_came_from(monkeypatch, capsys) -> None:
    rc, rows, text = config_output(
        monkeypatch,
        capsys,
        {
            "GPULAB_PORT": "9000",
            "GPULAB_ADMIN_TOKEN": "s3cret-token",
            "GPULAB_BILLING_DB_URL": "postgresql://billing:pw@db/billing",
        },
        "--spawner",
        "docker",
    )
    assert rc == 0
    assert re.fullmatch(r"9000 +environment", rows["GPULAB_PORT"])
    assert re.fullmatch(r"docker +flag --spawner", rows["GPULAB_SPAWNER"])
    assert re.fullmatch(r"8081 +default", rows["GPULAB_HUB_PORT"])
    assert re.fullmatch(r"\*\*\* \(set\) +environment", rows["GPULAB_ADMIN_TOKEN"])
    assert "postgresql://billing:***@db/billing" in rows["GPULAB_BILLING_DB_URL"]
    assert "s3cret" not in text and ":pw@" not in text
    assert "GPULAB_RUN_AS" not in rows  # internal: only with --all
    rows_all = config_output(monkeypatch, capsys, {}, "--all")[1]
    assert "GPULAB_RUN_AS" in rows_all and "GPULAB_REQUIRE_ALL" in rows_all


def test_config_lists_every_bad_value_and_unknown_name(monkeypatch, capsys) -> None:
    rc, rows, text = config_output(
        monkeypatch, capsys, {"GPULAB_PORT": "x", "GPULAB_BILLING": "maybe", "GPULAB_PROT": "1"}
    )
    assert rc == 2
    assert re.fullmatch(r"'x' NOT ALLOWED +environment", rows["GPULAB_PORT"])
    assert "gpulab: GPULAB_PORT: 'x' is not allowed; expected a port 1-65535" in text
    assert "gpulab: GPULAB_BILLING: 'maybe' is not allowed" in text
    assert "not gpulab settings (a typo?): GPULAB_PROT" in text


def test_config_markdown_is_the_readme_table(monkeypatch, capsys) -> None:
    assert main(["config", "--markdown"]) == 0
    assert capsys.readouterr().out == settings.markdown()
