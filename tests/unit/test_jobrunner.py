"""The job runner (spawners/inside/jobrunner.py), run for real as a subprocess (issue 26): what a
job's command sees, how its exit and signals pass, and that the server still answers the hub."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from harness import free_port, wait_for

RUNNER = [sys.executable, "-m", "gpulab.spawners.inside.jobrunner"]


def start(home: Path, command: str, stderr=subprocess.PIPE, **env: str) -> subprocess.Popen:
    full = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "GPULAB_JOB_ID": "17",
        "GPULAB_JOB_COMMAND": command,
        "GPULAB_JOB_LINGER": "0",
        **env,
    }
    return subprocess.Popen(
        RUNNER,
        env=full,
        cwd=str(home),
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )


def run(home: Path, command: str, **env: str) -> tuple[int, str, str]:
    proc = start(home, command, **env)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def seen_env(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rpartition(b")")[2].split()[0] not in (b"Z", b"X")


@pytest.mark.parametrize(
    ("command", "code"),
    [("exit 0", 0), ("exit 7", 7), ("kill -TERM $$", 128 + 15), ("kill -KILL $$", 128 + 9)],
)
def test_exit_code_passes_through(tmp_path: Path, command: str, code: int) -> None:
    """Issue 26 (Jobs: status, exit code): the runner exits with the command's exit code, 128+N
    when a signal N killed it, and says so in the server's log."""
    rc, _, err = run(tmp_path, command)
    assert rc == code
    assert f"[gpulab] job 17 exited with code {code}" in err


def test_sigusr1_reaches_only_a_child_that_catches_it(tmp_path: Path) -> None:
    """Issue 26 (Preemption: the checkpoint signal the job handles): SIGUSR1 to the runner goes
    to the job's processes that catch it; one that does not catch it is not killed by it.
    SIGTERM (the stop) then reaches the whole process group, and the exit is 128+15."""
    catcher = tmp_path / "catcher.py"
    catcher.write_text(
        "import signal, time, pathlib\n"
        "signal.signal(signal.SIGUSR1, lambda *a: pathlib.Path('got-usr1').write_text('yes'))\n"
        "pathlib.Path('ready').write_text('ready')\n"
        "while True: time.sleep(0.1)\n"
    )
    command = (
        f"{sys.executable} catcher.py & echo $! > catcher.pid; "
        "sleep 1000 & echo $! > sleep.pid; wait"
    )
    proc = start(tmp_path, command)
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), what="the catcher to be ready")
        wait_for(lambda: (tmp_path / "sleep.pid").exists(), what="sleep to start")
        catcher_pid = int((tmp_path / "catcher.pid").read_text())
        sleep_pid = int((tmp_path / "sleep.pid").read_text())
        wait_for(lambda: alive(sleep_pid), what="sleep to run")

        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: (tmp_path / "got-usr1").exists(), what="the catcher to get SIGUSR1")
        assert proc.poll() is None, "the runner itself must survive SIGUSR1"
        assert alive(sleep_pid), "a process that does not catch SIGUSR1 was killed by it"
        assert alive(catcher_pid)

        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + 15
        wait_for(lambda: not alive(sleep_pid), what="SIGTERM to reach sleep")
        wait_for(lambda: not alive(catcher_pid), what="SIGTERM to reach the catcher")
        assert f"sent to {catcher_pid}" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for name in ("catcher.pid", "sleep.pid"):
            path = tmp_path / name
            if path.exists():
                try:
                    os.kill(int(path.read_text()), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_resume_is_the_newest_checkpoint(tmp_path: Path) -> None:
    """Issue 26 (Preemption: GPULAB_RESUME pointing at the last checkpoint): the newest entry of
    ~/.gpulab/jobs/<id>/checkpoints by modification time; a name starting with "." (still being
    written) is not one; "" with none."""
    rc, out, err = run(tmp_path, "env")
    assert rc == 0
    folder = tmp_path / ".gpulab" / "jobs" / "17" / "checkpoints"
    env = seen_env(out)
    assert env["GPULAB_CHECKPOINT_DIR"] == str(folder)
    assert env["GPULAB_RESUME"] == ""
    assert folder.is_dir(), "the runner makes the checkpoint folder"
    assert "no checkpoint to resume from" in err

    now = time.time()
    for name, age in (("step-200.pt", 300), ("step-400.pt", 100), ("step-300.pt", 200)):
        (folder / name).write_text(name)
        os.utime(folder / name, (now - age, now - age))
    (folder / ".step-500.pt.tmp").write_text("half")  # newest, unfinished
    rc, out, err = run(tmp_path, "env", GPULAB_JOB_ATTEMPT="2")
    env = seen_env(out)
    assert env["GPULAB_RESUME"] == str(folder / "step-400.pt")
    assert env["GPULAB_JOB_ATTEMPT"] == "2"
    assert env["GPULAB_CHECKPOINT_SIGNAL"] == "SIGUSR1"
    assert f"resuming from {folder / 'step-400.pt'}" in err


def test_torch_environment_of_a_gang_rank(tmp_path: Path) -> None:
    """Issue 26 (8 cards in one click, many nodes: the NCCL/torch environment for torchrun): a
    rank of a 2-node x 4-card job sees LOCAL_WORLD_SIZE, WORLD_SIZE, NODE_RANK, MASTER_* and
    torchrun's PET_* equivalents; OMP_NUM_THREADS shares the server's CPUs."""
    rc, out, _ = run(
        tmp_path,
        "env",
        GPULAB_JOB_NODES="2",
        GPULAB_JOB_RANK="1",
        GPULAB_JOB_GPUS="4",
        GPULAB_JOB_CPUS="32",
        MASTER_ADDR="gpulab-job-17-0",
        MASTER_PORT="29500",
        CUDA_VISIBLE_DEVICES="GPU-a,GPU-b,GPU-c,GPU-d",
    )
    assert rc == 0
    env = seen_env(out)
    expected = {
        "LOCAL_WORLD_SIZE": "4",
        "NNODES": "2",
        "NODE_RANK": "1",
        "WORLD_SIZE": "8",
        "MASTER_ADDR": "gpulab-job-17-0",
        "MASTER_PORT": "29500",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "4",
        "PET_MASTER_ADDR": "gpulab-job-17-0",
        "PET_MASTER_PORT": "29500",
        "OMP_NUM_THREADS": "8",
        "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c,GPU-d",
        "GPULAB_JOB_ID": "17",
    }
    assert {k: env.get(k) for k in expected} == expected
    assert "GPULAB_JOB_COMMAND" not in env, "the runner's own settings stay the runner's"


def test_one_node_rendezvous_is_local(tmp_path: Path) -> None:
    """Issue 26: a one-node job gets 127.0.0.1 and a free port, one local process without
    cards (LOCAL_WORLD_SIZE is at least 1)."""
    rc, out, _ = run(tmp_path, "env", GPULAB_JOB_GPUS="0")
    env = seen_env(out)
    assert rc == 0
    assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "127.0.0.1"
    assert env["MASTER_PORT"].isdigit() and env["MASTER_PORT"] == env["PET_MASTER_PORT"]
    assert (env["LOCAL_WORLD_SIZE"], env["WORLD_SIZE"], env["NODE_RANK"]) == ("1", "1", "0")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # the answer itself is what the tests look at


_OPENER = urllib.request.build_opener(_NoRedirect)


def get(url: str, method: str = "GET") -> tuple[int, bytes]:
    return answer(url, method)[:2]


def answer(url: str, method: str = "GET") -> tuple[int, bytes, str]:
    """(status, body, Location) of one request, redirects not followed."""
    try:
        with _OPENER.open(urllib.request.Request(url, method=method), timeout=10) as r:
            return r.status, r.read(), r.headers.get("Location", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Location", "")


def test_answers_http_while_running(tmp_path: Path) -> None:
    """Issue 26 (a job needs no running server, yet runs as one): the runner answers the hub's
    readiness check on the server's port (any answer below 500: a GET is the hub's redirect,
    a POST 403), while the job runs; a job that ends before the hub asked waits for that
    first request, so its start is no failed start."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/user/alice/job-17/"
    proc = start(tmp_path, "sleep 1000", JUPYTERHUB_SERVICE_URL=url, GPULAB_JOB_LINGER="30")
    try:
        status, body = wait_for(lambda: _try(get, url), what="the runner to answer")
        assert (status, body) == (302, b"")
        assert get(url + "api/contents", "POST")[0] == 403
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert proc.returncode == 128 + 15

    port = free_port()
    url = f"http://127.0.0.1:{port}/user/alice/job-17/"
    log = tmp_path / "server.log"
    with open(log, "w") as err:
        quick = start(
            tmp_path, "exit 3", stderr=err, JUPYTERHUB_SERVICE_URL=url, GPULAB_JOB_LINGER="60"
        )
    try:
        wait_for(lambda: "exited with code 3" in log.read_text(), what="the command's end")
        assert quick.poll() is None, "a quick job's runner waits for the hub's first request"
        assert wait_for(lambda: _try(get, url), what="the runner to answer")[0] == 302
        assert quick.wait(timeout=30) == 3
    finally:
        if quick.poll() is None:
            quick.kill()
        quick.communicate()


def _try(fn, *args):
    try:
        return fn(*args)
    except OSError:
        return None


def test_answers_as_a_server_that_is_not_running(tmp_path: Path) -> None:
    """Issue 26, finding F4 of the red team (anyone, not logged in, told running job ids from
    stopped ones: the runner answered ``200 gpulab job runner``): every request to a running
    job's URL gets what the hub gives for a server that is not running, JupyterHub's
    PrefixRedirectHandler: a GET is 302 to the same path below ``/hub/`` on the hub's public
    host, query kept; HEAD and OPTIONS 405, other methods 403 (the hub's refusal before its
    missing handler). No word of the runner in any answer."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/user/alice/job-17/"
    env = {
        "JUPYTERHUB_SERVICE_URL": url,
        "JUPYTERHUB_BASE_URL": "/",
        "JUPYTERHUB_HOST": "http://hub.example:8000",
        "GPULAB_JOB_LINGER": "30",
    }
    proc = start(tmp_path, "sleep 1000", **env)
    try:
        wait_for(lambda: _try(get, url), what="the runner to answer")
        host = "http://hub.example:8000"
        for path, location in (
            ("/user/alice/job-17/", "/hub/user/alice/job-17/"),
            ("/user/alice/job-17/api/status?x=1", "/hub/user/alice/job-17/api/status?x=1"),
            ("/user/alice/job-17", "/hub/user/alice/job-17"),
        ):
            status, body, loc = answer(f"http://127.0.0.1:{port}{path}")
            assert (status, loc) == (302, host + location), path
            assert b"runner" not in body
        for method, code in (("HEAD", 405), ("OPTIONS", 405), ("POST", 403), ("DELETE", 403)):
            status, body, loc = answer(url, method)
            assert (status, loc) == (code, ""), method
            assert b"runner" not in body
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace needs root")
def test_a_private_job_network_keeps_the_host_out_and_the_hub_in(tmp_path: Path) -> None:
    """Issue 26, red-team finding (HIGH): the launcher with ``GPULAB_JOB_NETWORK=private`` (what
    the local spawner sets for a job server) makes the runner's HTTP socket in the host's
    network, then puts the job in a network of its own: the hub still gets its answer on the
    server's port, the command's own rendezvous on 127.0.0.1 works, and a port listening on the
    host's loopback (another user's job or server) is out of its reach."""
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen(4)
    port = free_port()
    url = f"http://127.0.0.1:{port}/user/alice/job-17/"
    command = (
        'python3 -c "import socket as s, os\n'
        "a = s.socket(); a.bind(('127.0.0.1', int(os.environ['MASTER_PORT']))); a.listen(1)\n"
        "s.create_connection(('127.0.0.1', int(os.environ['MASTER_PORT'])), 5)\n"
        "print('own rendezvous', a.accept()[1][0], flush=True)\n"
        "try:\n"
        f"    s.create_connection(('127.0.0.1', {host.getsockname()[1]}), 5); print('REACHED')\n"
        "except OSError as e:\n"
        "    print('host unreachable', type(e).__name__)\n"
        '"; echo gloo $GLOO_SOCKET_IFNAME; sleep 1000'
    )
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(tmp_path),
        "GPULAB_JOB_ID": "17",
        "GPULAB_JOB_COMMAND": command,
        "GPULAB_JOB_NETWORK": "private",
        "JUPYTERHUB_SERVICE_URL": url,
        "JUPYTERHUB_BASE_URL": "/",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulab.spawners.inside.launcher"],
        env=env,
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert wait_for(lambda: _try(get, url), what="the runner to answer")[0] == 302
        assert proc.stdout.readline().strip() == "own rendezvous 127.0.0.1"
        assert proc.stdout.readline().strip() == "host unreachable ConnectionRefusedError"
        assert proc.stdout.readline().strip() == "gloo lo"  # gloo binds the job's loopback
        host.settimeout(0.5)
        with pytest.raises(TimeoutError):
            host.accept()
        assert proc.poll() is None
    finally:
        host.close()
        proc.terminate()
        proc.communicate(timeout=30)
    assert proc.returncode == 128 + 15
