"""``gpulab jobs``'s own parsing (issue 26): what a command line becomes in the job spec sent to
the hub, and where the CLI finds the hub; the hub checks the spec itself (tests/e2e)."""

from __future__ import annotations

import pytest

from gpulab.hub_config.cli.jobs import HubError, api_url, job_spec
from gpulab.hub_config.cli.main import build_parser


def parse(*argv: str):
    return build_parser().parse_args(["jobs", *argv])


def test_words_after_the_separator_are_the_command_quoted_for_bash() -> None:
    args = parse("submit", "--gpu", "a100-80g", "--gpus", "8", "--", "python", "a b.py", "--lr=1")
    spec = job_spec(args)
    assert spec == {"command": "python 'a b.py' --lr=1", "gpu": "a100-80g", "gpus": 8}


def test_one_word_is_a_shell_line_as_given() -> None:
    spec = job_spec(parse("submit", "--gpu", "none", "--", "make train && echo done"))
    assert spec == {"command": "make train && echo done", "gpu": "none", "gpus": 0}


def test_every_option_reaches_its_field() -> None:
    args = parse(
        "submit", "--gpu", "rtx-4090", "--nodes", "2", "--spot", "--max-price", "2.00",
        "--confirm-max-price", "--image", "pytorch", "--dataset", "a", "--dataset", "@bob/b",
        "--priority", "-3", "--checkpoint-interval", "600", "--max-attempts", "4",
        "--name", "ft", "--cwd", "runs/x", "--course", "ml101", "--", "torchrun", "t.py",
    )  # fmt: skip
    assert job_spec(args) == {
        "command": "torchrun t.py",
        "gpu": "rtx-4090",
        "gpus": 1,
        "nodes": 2,
        "pricing": "spot",
        "max_price": "2.00",
        "confirm_max_price": True,
        "image": "pytorch",
        "datasets": ["a", "@bob/b"],
        "priority": -3,
        "checkpoint_interval": 600,
        "max_attempts": 4,
        "name": "ft",
        "cwd": "runs/x",
        "course": "ml101",
    }


def test_no_command_is_refused_naming_it() -> None:
    with pytest.raises(HubError, match=r"^command: "):
        job_spec(parse("submit", "--gpu", "none"))


def test_the_hub_url_is_its_rest_api(monkeypatch) -> None:
    monkeypatch.delenv("JUPYTERHUB_API_URL", raising=False)
    assert api_url("https://hub.example.org/") == "https://hub.example.org/hub/api"
    assert api_url("http://127.0.0.1:8081/hub/api") == "http://127.0.0.1:8081/hub/api"
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")
    assert api_url("") == "http://127.0.0.1:8081/hub/api"
    monkeypatch.delenv("JUPYTERHUB_API_URL")
    with pytest.raises(HubError, match="--hub"):
        api_url("")
