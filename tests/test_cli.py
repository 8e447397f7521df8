"""`gpulab up` refuses bad settings before starting anything, naming the setting."""

from __future__ import annotations

import subprocess

from harness import VENV_BIN


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
