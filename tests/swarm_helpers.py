"""A real multi-node Docker Swarm on the one test machine, for the Swarm spawner's tests.

``swarm_cluster`` (module-scoped) starts N extra Docker Engines (default 2), each in its own
network namespace with its own data root, exec root and socket, linked by veth pairs to a bridge
this fixture creates (traffic stays between these namespaces and the root namespace's hub). Node 1
initialises the swarm, the others join it. Every node advertises simulated GPUs as Swarm generic
resources (``NVIDIA-GPU=GPU-SIM-...``, the ids say "SIM") and carries the labels a real GPU node
would: ``gpulab.gpu-type=<catalog slug>`` and ``gpulab.simulated=true``. The test image is loaded
into every engine (no registry is reachable). Teardown removes everything: services, engines
(waited for), their containers, mounts, data dirs, namespaces, the bridge and the FORWARD rule.

A module sets ``SWARM_NODES = [("a100-80g", 2), ...]`` (one GPU type and card count per node) to
change the cluster's shape. conftest.py loads this module as a plugin.

Traps (see /work/shared/recipes): ``ip netns exec`` remounts /sys and hides the cgroup v1 mounts,
so engines enter only the network namespace (``nsenter --net``); the root dockerd sets the
FORWARD policy to DROP, so the bridge gets an ACCEPT rule or ``swarm join`` times out; every node
has the same hostname (same UTS namespace), so nodes are told apart by id and label.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from harness import wait_for

DEFAULT_NODES = [("a100-80g", 2), ("a100-80g", 2)]
# A 1 s dispatcher heartbeat: the manager marks a dead node down in a few seconds (the default,
# 5 s, makes it take about 15 s). docs/swarm.md recommends the same for GPU clusters.
HEARTBEAT_NS = 1_000_000_000


def _run(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=120, **kw)


def _descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process below them (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, ()))
    return out


def _pids_naming(text: str) -> set[int]:
    """Processes whose command line contains ``text`` (an engine's containerd shims)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in raw:
                out.add(int(entry))
    return out


def _wait_gone(pids: set[int], timeout: float) -> set[int]:
    """Wait until none of ``pids`` exists (zombies count as gone); return those still alive."""
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            try:
                state = (
                    Path(f"/proc/{pid}/stat")
                    .read_text(errors="replace")
                    .rpartition(")")[2]
                    .split()[0]
                )
            except OSError:
                state = "X"
            if state in ("Z", "X"):
                alive.discard(pid)
        if alive:
            time.sleep(0.05)
    return alive


@dataclass
class SwarmNode:
    """One engine of the test swarm."""

    index: int  # 1-based; node 1 is the manager
    netns: str
    address: str  # on the bridge
    data_root: Path
    exec_root: Path
    socket: Path
    gpu_type: str
    gpus: list[str]
    proc: subprocess.Popen | None = None
    node_id: str = ""

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def client(self, timeout: int = 60):
        import docker

        return docker.APIClient(base_url=self.url, version="auto", timeout=timeout)


@dataclass
class SwarmCluster:
    """The running test swarm: its engines, their sockets and addresses, and ways to hurt them."""

    token: str
    bridge: str
    hub_ip: str  # the root namespace's address on the bridge: where servers reach the hub
    nodes: list[SwarmNode]
    image: str
    base: Path
    forward_rule: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def manager(self) -> SwarmNode:
        return self.nodes[0]

    @property
    def manager_url(self) -> str:
        return self.manager.url

    @property
    def node_urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def node_ids(self) -> list[str]:
        return [n.node_id for n in self.nodes]

    @property
    def node_addresses(self) -> list[str]:
        return [n.address for n in self.nodes]

    @property
    def node_engines(self) -> dict[str, str]:
        """Node id -> engine URL: how the hub reaches a task's container for `docker exec`."""
        return {n.node_id: n.url for n in self.nodes}

    def node_of(self, node_id: str) -> SwarmNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def manager_client(self):
        return self.manager.client()

    def node_state(self, index: int) -> tuple[str, str]:
        """(state, availability) of node ``index`` (1-based) as the manager sees it."""
        info = self.manager_client().inspect_node(self.nodes[index - 1].node_id)
        return info["Status"]["State"], info["Spec"]["Availability"]

    def kill_node(self, index: int) -> None:
        """A node failure: SIGKILL node ``index``'s engine, its containerd, its shims and every
        container process under them, as if the machine lost power."""
        node = self.nodes[index - 1]
        assert index != 1, "node 1 is the swarm's only manager"
        roots = {node.proc.pid} if node.proc and node.proc.poll() is None else set()
        roots |= _pids_naming(f"{node.exec_root}/")
        victims = _descendants(roots)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if node.proc is not None:
            node.proc.wait(30)
        assert not _wait_gone(victims, 30), "node processes survived SIGKILL"

    def set_availability(self, index: int, availability: str) -> None:
        client = self.manager_client()
        node_id = self.nodes[index - 1].node_id
        info = client.inspect_node(node_id)
        spec = dict(info["Spec"], Availability=availability)
        client.update_node(node_id, info["Version"]["Index"], spec)

    def drain_node(self, index: int) -> None:
        """Swarm's drain: nothing new on node ``index``, and Swarm shuts its tasks down."""
        self.set_availability(index, "drain")

    def pause_node(self, index: int) -> None:
        """Swarm's pause, the gentle drain an operator uses before maintenance: nothing new is
        placed on node ``index``; its running tasks keep going until they stop."""
        self.set_availability(index, "pause")

    def activate_node(self, index: int) -> None:
        self.set_availability(index, "active")

    def wait_node_state(self, index: int, state: str, timeout: float = 60) -> None:
        wait_for(
            lambda: self.node_state(index)[0] == state,
            timeout,
            interval=0.2,
            what=f"node {index} to be {state}",
        )

    def services(self) -> list[dict]:
        return self.manager_client().services()


def _pick_subnet() -> str:
    """A free 10.213.X.0/24 (X random, so that two sessions on one machine don't clash)."""
    routes = _run("ip", "-4", "route").stdout
    for _ in range(50):
        x = random.randint(1, 250)
        if f"10.213.{x}." not in routes:
            return f"10.213.{x}"
    raise RuntimeError("no free 10.213.X.0/24 subnet for the test swarm")


def _start_engine(node: SwarmNode, log: Path) -> subprocess.Popen:
    for d in (node.data_root, node.exec_root):
        d.mkdir(parents=True, exist_ok=True)
    args = [
        "nsenter",
        f"--net=/var/run/netns/{node.netns}",
        "dockerd",
        "--data-root",
        str(node.data_root),
        "--exec-root",
        str(node.exec_root),
        "-H",
        node.url,
        "--pidfile",
        str(node.exec_root / "dockerd.pid"),
        "--log-level",
        "warn",
    ]
    for gpu in node.gpus:
        args += ["--node-generic-resource", f"NVIDIA-GPU={gpu}"]
    with open(log, "ab") as out:
        # nsenter execs dockerd: the Popen's pid is the engine's.
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _engine_answers(node: SwarmNode) -> bool:
    if node.proc is not None and node.proc.poll() is not None:
        raise RuntimeError(f"dockerd of node {node.index} exited with {node.proc.returncode}")
    try:
        node.client(timeout=5).ping()
        return True
    except Exception:
        return False


def _load_image(image: str, node: SwarmNode) -> None:
    """``docker save IMAGE | docker -H NODE load``: no registry is reachable."""
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    load = subprocess.run(
        ["docker", "-H", node.url, "load", "-q"],
        stdin=save.stdout,
        capture_output=True,
        text=True,
        timeout=600,
    )
    save.stdout.close()
    assert save.wait(600) == 0 and load.returncode == 0, load.stderr


def _label_node(client, node: SwarmNode, name: str) -> None:
    info = client.inspect_node(node.node_id)
    labels = {
        "gpulab.gpu-type": node.gpu_type,
        "gpulab.simulated": "true",
        "gpulab.node": name,
    }
    spec = dict(info["Spec"], Labels=labels)
    client.update_node(node.node_id, info["Version"]["Index"], spec)


def _unmount_under(*roots: Path) -> None:
    """Lazily unmount what an engine killed by SIGKILL left mounted (overlays, netns files)."""
    prefixes = [str(r).rstrip("/") + "/" for r in roots]
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if any(target.startswith(p) or target + "/" == p for p in prefixes):
            mounts.append(target)
    for target in sorted(mounts, key=len, reverse=True):
        _run("umount", "-l", target, check=False)


def teardown(cluster: SwarmCluster) -> None:
    """Remove every trace of the cluster, also after a failed start."""
    try:
        client = cluster.manager_client()
        client.timeout = 10
        for svc in client.services():
            client.remove_service(svc["ID"])
    except Exception:
        pass
    # A clean engine stop stops its containers: SIGTERM first, SIGKILL for what remains.
    for node in cluster.nodes:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
    for node in cluster.nodes:
        if node.proc is not None:
            try:
                node.proc.wait(30)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(10)
        rest = _descendants(_pids_naming(f"{node.exec_root}/"))
        for pid in rest:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_gone(rest, 30)
    for node in cluster.nodes:
        _unmount_under(node.data_root, node.exec_root)
        _run("ip", "netns", "del", node.netns, check=False)
    _run("ip", "link", "del", cluster.bridge, check=False)
    if cluster.forward_rule:
        _run("iptables", "-D", *cluster.forward_rule, check=False)
    shutil.rmtree(cluster.base, ignore_errors=True)
    shutil.rmtree(Path("/run") / f"gls-{cluster.token}", ignore_errors=True)


def start_cluster(shape: list[tuple[str, int]], image: str, log_dir: Path) -> SwarmCluster:
    """Bring up the swarm (see the module docstring); on any failure it is torn down."""
    token = secrets.token_hex(3)
    net = _pick_subnet()
    base = Path(f"/var/lib/gpulab-test-swarm-{token}")
    run_dir = Path("/run") / f"gls-{token}"  # short: unix socket paths have a 108-byte limit
    nodes = [
        SwarmNode(
            index=i,
            netns=f"gls-{token}-{i}",
            address=f"{net}.{10 + i}",
            data_root=base / f"n{i}",
            exec_root=run_dir / f"n{i}",
            socket=run_dir / f"n{i}.sock",
            gpu_type=gpu_type,
            gpus=[f"GPU-SIM-{token}-n{i}-{k}" for k in range(count)],
        )
        for i, (gpu_type, count) in enumerate(shape, start=1)
    ]
    bridge = f"brgl{token}"
    cluster = SwarmCluster(token, bridge, f"{net}.1", nodes, image, base)
    try:
        _run("ip", "link", "add", bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{net}.1/24", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
        rule = ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
        _run("iptables", "-I", *rule)
        cluster.forward_rule = rule
        for node in nodes:
            veth = f"vgl{token}{node.index}"
            ns = ["ip", "netns", "exec", node.netns]
            _run("ip", "netns", "add", node.netns)
            _run(
                "ip",
                "link",
                "add",
                veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                node.netns,
            )
            _run("ip", "link", "set", veth, "master", bridge, "up")
            _run(*ns, "ip", "addr", "add", f"{node.address}/24", "dev", "eth0")
            _run(*ns, "ip", "link", "set", "eth0", "up")
            _run(*ns, "ip", "link", "set", "lo", "up")
            node.proc = _start_engine(node, log_dir / f"dockerd-n{node.index}.log")
        for node in nodes:
            wait_for(
                lambda n=node: _engine_answers(n),
                60,
                interval=0.2,
                what=f"dockerd of node {node.index}",
            )
        manager = nodes[0].client()
        spec = manager.create_swarm_spec(dispatcher_heartbeat_period=HEARTBEAT_NS)
        manager.init_swarm(
            advertise_addr=nodes[0].address,
            listen_addr=f"{nodes[0].address}:2377",
            swarm_spec=spec,
        )
        join = manager.inspect_swarm()["JoinTokens"]["Worker"]
        for node in nodes[1:]:
            node.client().join_swarm(
                [f"{nodes[0].address}:2377"],
                join,
                listen_addr=f"{node.address}:2377",
                advertise_addr=node.address,
            )
        for node in nodes:
            node.node_id = node.client().info()["Swarm"]["NodeID"]

        def all_ready() -> bool:
            states = {n["ID"]: n["Status"]["State"] for n in manager.nodes()}
            return all(states.get(n.node_id) == "ready" for n in nodes)

        wait_for(all_ready, 60, interval=0.2, what="every swarm node to be ready")
        for node in nodes:
            _label_node(manager, node, f"n{node.index}")
        with ThreadPoolExecutor(len(nodes)) as pool:
            for done in [pool.submit(_load_image, image, n) for n in nodes]:
                done.result()
        return cluster
    except BaseException:
        teardown(cluster)
        raise


def swarm_ready_to_run() -> None:
    # Imported here: benchmarks/swarm_spawn.py imports this module without pytest's conftest.
    from conftest import require

    require(os.geteuid() == 0, "root (the test swarm makes network namespaces and engines)")
    for tool in ("dockerd", "nsenter", "ip", "iptables", "docker", "umount"):
        require(shutil.which(tool) is not None, f"{tool} (for the test swarm)")


@pytest.fixture(scope="module")
def swarm_cluster(request, docker, test_image: str, tmp_path_factory) -> SwarmCluster:
    swarm_ready_to_run()
    shape = getattr(request.module, "SWARM_NODES", DEFAULT_NODES)
    log_dir = Path(tmp_path_factory.mktemp("swarm-logs"))
    cluster = start_cluster(shape, test_image, log_dir)
    yield cluster
    teardown(cluster)


def engines_json(cluster: SwarmCluster) -> str:
    return json.dumps(cluster.node_engines)


# ---- a hub on the swarm ---------------------------------------------------------------------------


def swarm_hub_settings(cluster: SwarmCluster, catalog: Path, shared_homes: Path | None) -> dict:
    """``Hub`` settings for ``gpulab up --spawner swarm`` on ``cluster``. The hub binds to its
    address on the swarm's bridge (servers reach the hub API there); the cards are the nodes'.
    ``shared_homes`` stands in for a shared filesystem mounted on every node: all the engines
    run on this one machine, so a host directory is the same path on each of them."""
    from docker_helpers import GPULAB

    env = {
        "GPULAB_HUB_IP": cluster.hub_ip,
        "GPULAB_SWARM_MANAGER": cluster.manager_url,
        "GPULAB_SWARM_NODE_ENGINES": json.dumps(cluster.node_engines),
        "GPULAB_REPORTER_HEARTBEAT": "1",
    }
    if shared_homes is not None:
        env["GPULAB_SWARM_SHARED_HOME"] = f"{shared_homes}/{{username}}"
    cli = [GPULAB, "up", "--spawner", "swarm", "--catalog", str(catalog)]
    return {"simulate": "none", "cli": cli, "env": env}


def remove_hub_services(cluster: SwarmCluster, hub_dir: Path) -> None:
    """The services of a stopped hub (it stops its servers; a killed one leaves them)."""
    try:
        ident = (hub_dir / "hub-id").read_text().strip()
    except OSError:
        return
    client = cluster.manager_client()
    for svc in client.services(filters={"label": f"org.gpulab.hub-id={ident}"}):
        client.remove_service(svc["ID"])


def shared_homes_dir(tmp_path_factory) -> Path:
    """A host directory standing in for the shared home filesystem (see swarm_hub_settings);
    the servers' user (uid 1000) must pass through pytest's 0700 temp folders to reach it."""
    from harness import passable_for_accounts

    path = Path(tmp_path_factory.mktemp("shared-homes"))
    path.chmod(0o711)
    passable_for_accounts(path)
    return path


def service_of(cluster: SwarmCluster, hub_dir: Path, user: str) -> dict:
    ident = (hub_dir / "hub-id").read_text().strip()
    found = cluster.manager_client().services(
        filters={"label": [f"org.gpulab.hub-id={ident}", f"org.gpulab.user={user}"]}
    )
    assert len(found) == 1, [s["Spec"]["Name"] for s in found]
    return found[0]


def running_task(cluster: SwarmCluster, service_id: str) -> dict:
    tasks = cluster.manager_client().tasks(
        filters={"service": service_id, "desired-state": "running"}
    )
    running = [t for t in tasks if t["Status"]["State"] == "running"]
    assert len(running) == 1, [t["Status"] for t in tasks]
    return running[0]
