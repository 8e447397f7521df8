"""SSH into a Docker server (issue 25): the gateway runs the session in the user's container, as
its user, with the server's environment; `ssh -L` reaches the container's own ports only; the
server's stop ends the session. Debian's OpenSSH client against a real hub's gateway and a real
Docker Engine.

Issue 25 points covered: "SSH into your own server ... lands in a shell inside the user's running
server, as their account, with the server's environment"; "exit codes passed back", PTYs;
"Port forwarding to the user's own server only"; "the server's stop ends its SSH sessions"; with
it stopped, `ssh NAME@hub` says files move only while it runs (a container's home is never reached
as the shared uid on the node) and names the upload page (it said "sftp, scp and rsync work now").
Fails on the code before issue 25 (no SSH endpoint).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from docker_helpers import cleanup, container_of, docker_hub_settings
from harness import Hub, free_port, wait_for
from ssh_helpers import (
    HTTP_GET,
    assert_stop_ends_session,
    person,
    session_of,
    ssh,
    ssh_cmd,
    start_http_server,
    wait_gateway,
)


def sftp_ls(hub: Hub, name: str, key, folder: Path) -> subprocess.CompletedProcess:
    batch = folder / "ls.batch"
    batch.write_text("ls\n")
    opts = ssh_cmd(hub, name, key)[3:-1]  # the key options
    return subprocess.run(
        ["sftp", "-P", str(hub.ssh_port), *opts, "-b", str(batch), f"{name}@127.0.0.1"],
        capture_output=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def shub(module_hub_factory, docker, catalog: Path) -> Hub:
    h = module_hub_factory(
        "ssh-docker",
        on_stop=lambda hub: cleanup(docker, hub),
        ssh_port=True,
        **docker_hub_settings(catalog),
    )
    wait_gateway(h)
    return h


def test_ssh_into_a_container_server(shub: Hub, docker, tmp_path: Path) -> None:
    name, _, key = person(shub, tmp_path, "ssd")
    shub.spawn_ready(name, {"gpu": "rtx-4090"}, timeout=120)
    facts = session_of(shub, name)
    assert facts["kind"] == "docker" and facts["container"], facts
    container = container_of(docker, shub, name)
    cuda = facts["env"]["CUDA_VISIBLE_DEVICES"]

    r = ssh(shub, name, key, 'echo "$CUDA_VISIBLE_DEVICES|$(id -u)|$PWD|$(hostname)"')
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip() == (
        f"{cuda}|{facts['uid']}|{facts['home']}|{container.attrs['Config']['Hostname']}"
    )
    assert ssh(shub, name, key, "exit 5").returncode == 5
    r = ssh(shub, name, key, "-tt", "tty; stty size")
    assert r.returncode == 0 and b"/dev/pts/" in r.stdout, (r.stdout, r.stderr)

    # A port inside the container is the user's; the hub's ports are not in its namespace.
    port = free_port()
    start_http_server(shub, name, key, port)

    def served() -> bool:
        r = ssh(shub, name, key, "-W", f"localhost:{port}", "", input=HTTP_GET)
        return r.returncode == 0 and r.stdout.startswith(b"HTTP/1.0 200")

    wait_for(served, 30, 0.5, "the container's HTTP server through ssh -W")
    for target in (shub.port, shub.hub_port, shub.billing_port):
        r = ssh(shub, name, key, "-W", f"127.0.0.1:{target}", "", input=HTTP_GET)
        assert r.returncode == 255 and b"HTTP" not in r.stdout, (target, r.stderr)

    assert_stop_ends_session(shub, name, key, lambda: shub.stop_server(name, timeout=120), 60)

    # No server: no shell, and the message does not promise files it cannot move (a container's
    # home is reached only through the running container): it names the upload page instead.
    r = ssh(shub, name, key, "echo should-not-run")
    assert r.returncode == 1 and b"should-not-run" not in r.stdout
    message = r.stderr.decode()
    assert "not running" in message and "only while your server runs" in message, message
    assert "work now" not in message and "/hub/upload" in message, message
    r = sftp_ls(shub, name, key, tmp_path)
    assert r.returncode != 0, (r.stdout, r.stderr)
