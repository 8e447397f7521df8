"""`gpulab up` refuses bad settings before starting anything, naming the setting."""

from __future__ import annotations

import subprocess

from harness import VENV_BIN

from gpulab.hub_config.cli.main import build_parser


def gpulab(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "gpulab"), *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


def test_unknown_simulated_gpu_type_is_refused(tmp_path) -> None:
    r = gpulab("up", "--data-dir", str(tmp_path / "d"), "--simulate-gpus", "TPU-V5:2", cwd=tmp_path)
    assert r.returncode == 2
    assert "simulate_gpus: unknown GPU type 'TPU-V5'; allowed: rtx-4090" in r.stderr
    assert not (tmp_path / "d").exists()


def test_bad_catalog_is_refused_with_the_key(tmp_path) -> None:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text('currency = "CNY"\ntrial_credit = "10"\nmax_gpus_per_server = 2\n')
    r = gpulab("up", "--data-dir", str(tmp_path / "d"), "--catalog", str(catalog), cwd=tmp_path)
    assert r.returncode == 2
    assert "no_gpu: required key is missing" in r.stderr
    assert "gpu_types: required key is missing" in r.stderr


def test_every_up_option_says_what_it_is_for(tmp_path) -> None:
    r = gpulab("up", "--help", cwd=tmp_path)
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "--port PORT port browsers connect to: the proxy's public port (default 8000)" in text
    assert "--hub-port HUB_PORT the hub's own port, behind the proxy (default 8081)" in text
    assert "--proxy-api-port PROXY_API_PORT configurable-http-proxy's REST API port" in text
    # argparse leaves an option without help as its bare name: every option must say more.
    up = build_parser()._subparsers._group_actions[0].choices["up"]
    assert [a.dest for a in up._actions if not a.help] == []
