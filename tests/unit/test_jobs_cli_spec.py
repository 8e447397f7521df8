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


def test_a_jobs_output_cannot_drive_the_readers_terminal() -> None:
    """Issue 26 (a job's output streamed and kept), red team wave 2 (C3): a job printed a window
    title (``ESC ] 0 ; … BEL``) and a clear-screen (``ESC [ 2 J``) that ``gpulab jobs logs``
    passed to whoever read the log in a terminal (an admin reading a user's job). On a terminal
    every control but tab, newline and carriage return is shown as text; piped, the bytes stay as
    the job wrote them."""
    import io

    from gpulab.hub_config.cli.jobs import _writer, for_terminal

    hostile = b"step 1\r\n\x1b]0;pwn\x07\x1b[2J\tloss 0.5\xc2\x9b31m \xe2\x82\xac\n"
    shown = for_terminal(hostile)
    assert b"\x1b" not in shown and b"\x07" not in shown and b"\xc2\x9b" not in shown
    assert shown == b"step 1\r\n^[]0;pwn^G^[[2J\tloss 0.5<U+009B>31m \xe2\x82\xac\n"

    class Out:
        def __init__(self, tty: bool) -> None:
            self.buffer, self.tty = io.BytesIO(), tty

        def isatty(self) -> bool:
            return self.tty

    terminal, pipe = Out(True), Out(False)
    _writer(terminal)(hostile)
    _writer(pipe)(hostile)
    assert terminal.buffer.getvalue() == shown
    assert pipe.buffer.getvalue() == hostile
