"""A training job's network, against other users (issue 26, red-team findings), with real parts:
a root hub, the job scheduler, the local spawner (each job server as its owner's account in its
own cgroup), the job runner, configurable-http-proxy.

- A local job's rendezvous (``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``: torchrun's TCPStore and
  gloo serve it with no authentication) was on the host's loopback, where every other user's
  jobs and servers joined it. Now the job's command runs in a network namespace of its own:
  its own rendezvous works, nobody outside reaches it.
- A running job's URL told anyone, not logged in, that the job ran (``200 gpulab job runner``
  where a stopped id redirects to the hub): it now answers as a server that is not running.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from pathlib import Path

import pytest
import requests
from harness import Hub, wait_for
from jobs_helpers import Jobs

from gpulab.spawners.storage.homes import home_name

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job servers run as users' accounts")

SCHEDULER = ["--JobScheduler.interval=0.3", "--JobScheduler.retry_seconds=1"]

# The victim: a torch-style rendezvous store on MASTER_ADDR:MASTER_PORT (listening on every
# address, as a careless store would), its own rank connecting to it first; then it serves
# whoever else connects (a stranger gets the store's key) until the test drops a file in its home.
VICTIM = r"""python3 - <<'EOF'
import os, socket, sys
port, addr = int(os.environ["MASTER_PORT"]), os.environ["MASTER_ADDR"]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", port))
srv.listen(16)
print("listening", addr, port, "home", os.environ["HOME"], flush=True)
mine = socket.create_connection((addr, port), 10)
peer, _ = srv.accept()
peer.sendall(b"store-key=42")
print("rendezvous", mine.recv(64).decode(), flush=True)
srv.settimeout(0.2)
while not os.path.exists(os.path.expanduser("~/stop-net-test")):
    try:
        other, who = srv.accept()
    except socket.timeout:
        continue
    print("STRANGER", who, flush=True)
    other.sendall(b"store-key=42")
    other.close()
sys.exit(7)
EOF"""

# The attacker's job: connect to the victim's rendezvous port on the shared loopback.
ATTACKER = r"""python3 - <<'EOF'
import socket
try:
    s = socket.create_connection(("127.0.0.1", PORT), 5)
    print("REACHED", s.recv(64), flush=True)
except OSError as e:
    print("UNREACHABLE", type(e).__name__, flush=True)
EOF"""


@pytest.fixture(scope="module")
def nhub(module_hub_factory) -> Hub:
    return module_hub_factory("jobnet", simulate="A100-80G:1", extra_args=SCHEDULER)


def new_user(hub: Hub) -> str:
    return hub.create_user(f"n{uuid.uuid4().hex[:8]}")


def _listening(jobs: Jobs, job_id: int) -> tuple[int, Path] | None:
    m = re.search(r"^listening \S+ (\d+) home (\S+)$", jobs.log(job_id), re.M)
    return (int(m.group(1)), Path(m.group(2))) if m else None


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 5) as s:
            s.settimeout(5)
            s.recv(64)
        return True
    except OSError:
        return False


def test_another_users_job_and_server_cannot_reach_a_jobs_rendezvous(nhub: Hub) -> None:
    """Issue 26 (jobs run as their user, isolated from others), red-team finding (HIGH, both
    attackers): Bob's job, and anything in the host's network (where every user's server
    runs: this test itself), connected to Alice's running job's MASTER_PORT and got her
    rendezvous store's data. Now: Alice's own rank reaches her store on MASTER_ADDR:MASTER_PORT
    inside the job, Bob's job gets no connection, nor does the host's loopback, her job saw no
    stranger, and the hub still sees her job running and then ended with its exit code (7)."""
    alice, bob = new_user(nhub), new_user(nhub)
    mine, his = Jobs(nhub, alice), Jobs(nhub, bob)
    victim = mine.submit(command=VICTIM, gpu="none", gpus=0, name="rendezvous")["id"]
    mine.wait_state(victim, "running")
    port, home = wait_for(lambda: _listening(mine, victim), 60, 0.2, "the job to listen")
    wait_for(lambda: "rendezvous store-key=42" in mine.log(victim), 30, 0.2, "its rendezvous")

    assert not _connects(port), "the host's loopback (other users' servers) reached the job"
    probe = his.submit(command=ATTACKER.replace("PORT", str(port)), gpu="none", gpus=0)["id"]
    ended = his.wait_state(probe, "succeeded", "failed")
    out = his.log(probe)
    assert "REACHED" not in out and "UNREACHABLE" in out, out
    assert ended["state"] == "succeeded", ended

    assert mine.get(victim)["state"] == "running"
    (home / "stop-net-test").touch()
    done = mine.wait_state(victim, "failed", "succeeded")
    assert done["exit_code"] == 7, done
    assert "STRANGER" not in mine.log(victim)


def test_a_running_jobs_url_answers_as_a_stopped_one(nhub: Hub) -> None:
    """Issue 26, red-team finding (LOW): anyone, not logged in, told which job ids of which
    user run: a running job's URL answered ``200 gpulab job runner``, a stopped one the hub's
    302. Now each request to a running job's URL gets the same status and Location as the same
    request for a job id that is not running (GET, with a path and query; HEAD; POST), while the
    hub's readiness check still passed (the job runs)."""
    user = new_user(nhub)
    jobs = Jobs(nhub, user)
    command = "while [ ! -e ~/stop-url-test ]; do sleep 0.2; done; echo home $HOME"
    jid = jobs.submit(command=command, gpu="none", gpus=0)["id"]
    jobs.wait_state(jid, "running")
    stopped = jid + 1000

    def answer(job: int, method: str, path: str, **headers: str) -> tuple[int, str]:
        url = nhub.user_url(user, f"job-{job}/{path}")
        r = requests.request(method, url, allow_redirects=False, timeout=30, headers=headers)
        location = r.headers.get("Location", "").replace(f"job-{job}", "job-ID")
        return r.status_code, location

    try:
        token = {"Authorization": f"token {jobs.token}"}
        for method, path, headers in (
            ("GET", "", {}),
            ("GET", "api/status?x=1", {}),
            ("GET", "lab", {"Sec-Fetch-Mode": "cors"}),
            ("HEAD", "", {}),
            ("OPTIONS", "", {}),
            ("POST", "api/contents", {}),
            ("DELETE", "api/contents/x", {}),
            ("POST", "api/contents", token),
            ("PUT", "api/contents/x", token),
            ("PATCH", "api/contents/x", {"Authorization": "token not-a-token"}),
        ):
            expected = answer(stopped, method, path, **headers)
            got = answer(jid, method, path, **headers)
            assert got == expected, (method, path, headers, expected)
            r = requests.get(nhub.user_url(user, f"job-{jid}/"), allow_redirects=False, timeout=30)
            assert "runner" not in r.text
        assert jobs.get(jid)["state"] == "running"
    finally:
        (nhub.data_dir / "users" / home_name(user) / "stop-url-test").touch()
    assert jobs.wait_state(jid, "succeeded", "failed")["exit_code"] == 0
