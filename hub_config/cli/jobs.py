"""``gpulab jobs``: submit, list, show, follow and cancel training jobs from a shell.

    gpulab jobs submit --gpu a100-80g --gpus 8 [--nodes 2] [--spot --max-price 2.00]
                       [--image pytorch] [--dataset D]... [--priority P]
                       [--checkpoint-interval S] [--name N] [--cwd DIR] [--follow] -- COMMAND...
    gpulab jobs list                 # each job's state and why it waits
    gpulab jobs show ID              # the job as JSON: attempts, timings, exit code
    gpulab jobs logs ID [--follow]   # its output across attempts
    gpulab jobs cancel ID

It talks to the hub's REST API (``/hub/api/gpulab/users/NAME/jobs``) with the standard library
only, so it works wherever Python does: on a laptop with a token the user made on the hub
(``--hub URL``, ``GPULAB_TOKEN``), or in a terminal of the user's own server, where JupyterHub
already set ``JUPYTERHUB_API_URL`` and ``JUPYTERHUB_API_TOKEN``. What the hub refuses is printed
as the hub says it (the field and what is allowed), with exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from gpulab.catalog.no_gpu import NO_GPU

TIMEOUT = 60.0


class HubError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def add_jobs_parser(sub: Any) -> None:
    p = sub.add_parser("jobs", help="training jobs: submit, list, show, logs, cancel")
    p.add_argument(
        "--hub",
        default="",
        help="the hub's URL, e.g. https://hub.example.org (default: $JUPYTERHUB_API_URL)",
    )
    p.add_argument(
        "--token", default="", help="an API token (default: $GPULAB_TOKEN or $JUPYTERHUB_API_TOKEN)"
    )
    p.add_argument("--user", default="", help="whose jobs (default: the token's user)")
    jobs = p.add_subparsers(dest="jobs_command", required=True)

    s = jobs.add_parser("submit", help="queue a job: a command run from your home on N cards")
    s.add_argument("--gpu", required=True, help="GPU type slug, or 'none' for no GPU")
    s.add_argument("--gpus", type=int, default=None, help="cards per node (default 1; 0 with none)")
    s.add_argument("--nodes", type=int, default=None, help="nodes (a gang; Swarm only)")
    s.add_argument("--image", default=None, help="image slug (default: the catalog's default)")
    s.add_argument("--dataset", action="append", default=[], help="a dataset to mount (repeat)")
    s.add_argument("--spot", action="store_true", help="run on spot cards (needs --max-price)")
    s.add_argument("--max-price", default=None, help="spot bid per card-hour")
    s.add_argument("--confirm-max-price", action="store_true", help="confirm a very high bid")
    s.add_argument("--course", default=None, help="run under a course (its rules and pool)")
    s.add_argument("--priority", type=int, default=None, help="-10..10 (higher first)")
    s.add_argument(
        "--checkpoint-interval", type=int, default=None, help="seconds between SIGUSR1 (0: off)"
    )
    s.add_argument("--max-attempts", type=int, default=None, help="attempts before giving up")
    s.add_argument("--name", default=None, help="a label")
    s.add_argument("--cwd", default=None, help="folder relative to your home")
    s.add_argument("-f", "--follow", action="store_true", help="print its output until it ends")
    s.add_argument("words", nargs=argparse.REMAINDER, metavar="COMMAND", help="-- COMMAND...")

    jobs.add_parser("list", help="your jobs and why each waits")
    for name, text in (("show", "one job as JSON"), ("cancel", "cancel a job")):
        c = jobs.add_parser(name, help=text)
        c.add_argument("job_id", type=int)
    lg = jobs.add_parser("logs", help="a job's output across its attempts")
    lg.add_argument("job_id", type=int)
    lg.add_argument("-f", "--follow", action="store_true", help="stream until the job ends")


class Client:
    """The hub's jobs API with one token (standard library HTTP)."""

    def __init__(self, api_url: str, token: str) -> None:
        self.api = api_url.rstrip("/")
        self.token = token

    def open(self, method: str, path: str, body: Any = None, timeout: float | None = TIMEOUT):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.api + path, data=data, method=method)
        req.add_header("Authorization", f"token {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            raw = e.read().decode(errors="replace")
            try:
                message = json.loads(raw).get("message") or raw
            except (ValueError, AttributeError):
                message = raw
            raise HubError(e.code, message) from None
        except urllib.error.URLError as e:
            raise HubError(0, f"cannot reach the hub at {self.api}: {e.reason}") from None

    def json(self, method: str, path: str, body: Any = None) -> Any:
        with self.open(method, path, body) as resp:
            return json.loads(resp.read() or b"null")


def api_url(hub: str) -> str:
    """The REST API's root from ``--hub`` (a hub URL, with or without /hub/api) or the env."""
    hub = (hub or os.environ.get("JUPYTERHUB_API_URL", "")).rstrip("/")
    if not hub:
        raise HubError(0, "no hub: pass --hub URL (or run inside a gpulab server)")
    return hub if hub.endswith("/hub/api") else hub + "/hub/api"


def job_spec(args: argparse.Namespace) -> dict[str, Any]:
    words = list(args.words)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise HubError(0, "command: give the command after --, e.g. -- python train.py")
    spec: dict[str, Any] = {
        "command": words[0] if len(words) == 1 else shlex.join(words),
        "gpu": args.gpu,
    }
    optional = {
        "gpus": args.gpus,
        "nodes": args.nodes,
        "image": args.image,
        "max_price": args.max_price,
        "course": args.course,
        "priority": args.priority,
        "checkpoint_interval": args.checkpoint_interval,
        "max_attempts": args.max_attempts,
        "name": args.name,
        "cwd": args.cwd,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    if "gpus" not in spec:
        spec["gpus"] = 0 if args.gpu == NO_GPU else 1
    if args.dataset:
        spec["datasets"] = list(args.dataset)
    if args.spot:
        spec["pricing"] = "spot"
    if args.confirm_max_price:
        spec["confirm_max_price"] = True
    return spec


# A job's output is its owner's to write: on a terminal, its control characters (escape
# sequences that retitle windows, clear screens, remap keys; C1 controls in UTF-8) are shown as
# text, not obeyed. Tabs, newlines and carriage returns (progress bars) pass. Piped: raw bytes.
_CONTROLS = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]")


def for_terminal(data: bytes) -> bytes:
    """``data`` with every control character but tab, newline and carriage return made visible
    (``ESC`` becomes ``^[``, a C1 control ``<U+009B>``)."""

    def shown(m: re.Match[bytes]) -> bytes:
        c = m.group()
        if len(c) == 2:
            return f"<U+{c[1]:04X}>".encode()
        return b"^" + bytes([c[0] ^ 0x40])

    return _CONTROLS.sub(shown, data)


def _writer(out: Any) -> Any:
    """Where output bytes go: ``out``'s binary buffer, cleaned of controls on a terminal."""
    binary = getattr(out, "buffer", None) or sys.stdout.buffer
    tty = getattr(out, "isatty", lambda: False)()

    def write(chunk: bytes) -> None:
        binary.write(for_terminal(chunk) if tty else chunk)
        binary.flush()

    return write


def follow_log(client: Client, base: str, job_id: int, out: Any) -> None:
    write = _writer(out)
    with client.open("GET", f"{base}/{job_id}/log?offset=0&follow=1", timeout=None) as resp:
        while True:
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
            if not chunk:
                break
            write(chunk)


def print_list(jobs: list[dict[str, Any]], out: Any) -> None:
    if not jobs:
        print("no jobs", file=out)
        return
    print(f"{'ID':>5}  {'STATE':<10} {'CARDS':<16} {'TRIES':>5}  {'JOB':<28} WHY", file=out)
    for j in jobs:
        cards = "no GPU" if j["gpu"] == NO_GPU else f"{j['gpu']} x{j['gpus']}"
        if j.get("nodes", 1) > 1:
            cards += f" x{j['nodes']}n"
        label = for_terminal((j.get("name") or j["command"]).encode()).decode()
        label = label if len(label) <= 28 else label[:27] + "…"
        why = j.get("reason") or ""
        if j.get("exit_code") is not None and j["state"] in ("succeeded", "failed"):
            why = why or f"exit {j['exit_code']}"
        print(
            f"{j['id']:>5}  {j['state']:<10} {cards:<16} {j.get('attempt_count', 0):>5}  "
            f"{label:<28} {why}",
            file=out,
        )


def cmd_jobs(args: argparse.Namespace, out: Any = None) -> int:
    out = out or sys.stdout
    try:
        token = args.token or os.environ.get("GPULAB_TOKEN") or ""
        token = token or os.environ.get("JUPYTERHUB_API_TOKEN", "")
        if not token:
            raise HubError(0, "no token: set GPULAB_TOKEN (a token made on the hub) or --token")
        client = Client(api_url(args.hub), token)
        user = args.user or client.json("GET", "/user")["name"]
        base = f"/gpulab/users/{quote(user)}/jobs"
        command = args.jobs_command
        if command == "submit":
            job = client.json("POST", base, job_spec(args))
            print(f"job {job['id']} {job['state']}: {job['command']}", file=sys.stderr)
            if not args.follow:
                print(job["id"], file=out)
                return 0
            follow_log(client, base, job["id"], out)
            job = client.json("GET", f"{base}/{job['id']}")
            print(f"job {job['id']} {job['state']}: {job['reason']}", file=sys.stderr)
            return 0 if job["state"] == "succeeded" else int(job.get("exit_code") or 1)
        if command == "list":
            print_list(client.json("GET", base)["jobs"], out)
        elif command == "show":
            print(json.dumps(client.json("GET", f"{base}/{args.job_id}"), indent=2), file=out)
        elif command == "logs":
            if args.follow:
                follow_log(client, base, args.job_id, out)
            else:
                with client.open("GET", f"{base}/{args.job_id}/log?offset=0") as resp:
                    _writer(out)(resp.read())
        elif command == "cancel":
            job = client.json("DELETE", f"{base}/{args.job_id}")
            print(f"job {job['id']} {job['state']}", file=out)
        return 0
    except HubError as e:
        prefix = f"{e.status} " if e.status else ""
        print(f"gpulab jobs: {prefix}{e}", file=sys.stderr)
        return 1
