"""``gpulab images --nodes`` / ``--preload``: the catalog's images on every node of a Docker Swarm.

A Swarm spawner starts a user's server on whichever node has the free cards, and a spawn never
pulls: every catalog image must already be on every GPU node. The manager's API lists the nodes
(``docker node ls``) but cannot see or move images on them, so each node's own engine is reached at
the URL the operator gives (``--node-engine NODE=URL``, repeated, ``--node-engines FILE``, or the
hub's own ``GPULAB_SWARM_NODE_ENGINES``).
The hub's node (the engine of ``--docker-host`` / ``DOCKER_HOST``, a manager) is the source:

- with ``--registry HOST:PORT`` an image is tagged and pushed there from the hub's node, then
  pulled on each node and tagged back to the catalog's name;
- without one (no registry reachable, the usual air-gapped lab) it is streamed from the hub's node
  engine into each node's engine (``docker save`` piped into ``docker load``), never touching disk.

An image counts as present on a node only with the hub node's image id: an older build under the
same tag is "stale" and copied again. Blocking Docker calls: this is a CLI.
"""

from __future__ import annotations

import json
import os
import sys
import time
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from gpulab.catalog import settings
from gpulab.spawners.docker.images import ENGINE_SCHEMES, NodeEngine, engine_client, image_id

# A node's name for people, as the hub reads it (spawners/swarm/cluster.py): engines may share a
# hostname (nodes cloned from one image), a label they don't.
NODE_NAME_LABEL = "gpulab.node"
# Progress lines while an image is on its way: at most one per node and image this often.
PROGRESS_EVERY_S = 5.0
MB = 2**20


class NodesUsageError(ValueError):
    """A wrong option or node-engine file; the message names the option (exit status 2)."""


class WrongEngine(RuntimeError):
    """The engine at a node's URL belongs to another node (or to no swarm)."""


@dataclass(frozen=True)
class SwarmNode:
    """One node as the manager sees it (``docker node inspect``)."""

    id: str
    hostname: str
    addr: str
    state: str  # ready, down, unknown, disconnected
    availability: str  # active, pause, drain
    role: str  # manager, worker
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def label_name(self) -> str:
        """The ``gpulab.node`` label: the name the hub shows and accepts for the node."""
        return self.labels.get(NODE_NAME_LABEL, "")

    @property
    def name(self) -> str:
        return f"{self.label_name or self.hostname} ({self.id[:12]})"

    @classmethod
    def from_attrs(cls, attrs: Mapping) -> SwarmNode:
        spec = attrs.get("Spec") or {}
        status = attrs.get("Status") or {}
        return cls(
            id=attrs["ID"],
            hostname=(attrs.get("Description") or {}).get("Hostname", ""),
            addr=status.get("Addr", ""),
            state=status.get("State", "unknown"),
            availability=spec.get("Availability", "active"),
            role=spec.get("Role", "worker"),
            labels=dict(spec.get("Labels") or {}),
        )


def handle(node: SwarmNode, nodes: list[SwarmNode]) -> str:
    """What to write as NODE in ``--node-engine NODE=URL``: the ``gpulab.node`` label or the
    hostname when no other node has it (nodes cloned from one image often share a hostname),
    else the node id."""
    for name in (node.label_name, node.hostname):
        if name and len([n for n in nodes if name in (n.label_name, n.hostname)]) == 1:
            return name
    return node.id


# ---- options ------------------------------------------------------------------------------------


def _engine_from(where: str, node: str, value) -> NodeEngine:
    if isinstance(value, str):
        engine = NodeEngine(value)
    elif isinstance(value, Mapping):
        unknown = set(value) - {"url", "tls_dir"}
        if unknown or not isinstance(value.get("url"), str):
            raise NodesUsageError(
                f"{where}: node {node!r} must be a URL string or a table with `url` (and "
                f"optionally `tls_dir`){'; unknown key ' + ', '.join(sorted(unknown)) if unknown else ''}"
            )
        tls = value.get("tls_dir")
        engine = NodeEngine(value["url"], None if tls is None else str(tls))
    else:
        raise NodesUsageError(f"{where}: node {node!r} must be a URL string or a table with `url`")
    problems = engine.problems()
    if problems:
        raise NodesUsageError(f"{where}: node {node!r}: {'; '.join(problems)}")
    return engine


def read_node_engines_file(path: str) -> dict[str, NodeEngine]:
    """A JSON or TOML file: ``{"NODE": "URL"}`` or ``{"NODE": {"url": ..., "tls_dir": ...}}``,
    optionally under a top-level ``node_engines`` key (so it can share a file with other
    settings). NODE is a node id, an unambiguous id prefix or a hostname."""
    where = f"--node-engines {path}"
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise NodesUsageError(f"{where}: cannot read it: {e.strerror or e}") from None
    try:
        data = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        kind = "JSON" if path.endswith(".json") else "TOML (name it .json for JSON)"
        raise NodesUsageError(f"{where}: not valid {kind}: {e}") from None
    if isinstance(data, Mapping) and isinstance(data.get("node_engines"), Mapping):
        data = data["node_engines"]
    if not isinstance(data, Mapping):
        raise NodesUsageError(f"{where}: expected a table of NODE = URL")
    return {str(node): _engine_from(where, str(node), value) for node, value in data.items()}


def read_hub_node_engines(text: str) -> dict[str, NodeEngine]:
    """``GPULAB_SWARM_NODE_ENGINES``, the JSON object the hub itself reads (``{"NODE": "URL"}``):
    set once for the hub, it serves ``gpulab images`` too."""
    where = "GPULAB_SWARM_NODE_ENGINES"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise NodesUsageError(f"{where}: not valid JSON: {e}") from None
    if not isinstance(data, Mapping):
        raise NodesUsageError(
            f'{where}: expected a JSON object of NODE to URL, e.g. {{"gpu-1": "tcp://10.0.0.12:2376"}}'
        )
    return {str(node): _engine_from(where, str(node), value) for node, value in data.items()}


def parse_node_engines(
    values: list[str],
    file: str | None = None,
    tls_dir: str | None = None,
    hub_json: str | None = None,
) -> dict[str, NodeEngine]:
    """``--node-engine NODE=URL`` values over the entries of ``--node-engines FILE`` over those of
    ``GPULAB_SWARM_NODE_ENGINES`` (``hub_json``, the hub's own setting); ``--node-tls DIR`` for
    every ``tcp://`` engine that names no TLS directory of its own."""
    engines = read_hub_node_engines(hub_json) if hub_json else {}
    if file:
        engines.update(read_node_engines_file(file))
    seen: set[str] = set()
    for value in values:
        node, sep, url = value.partition("=")
        node, url = node.strip(), url.strip()
        example = "e.g. gpu-node-1=tcp://10.0.0.12:2376"
        if not sep or not node or not url:
            raise NodesUsageError(f"--node-engine {value!r}: expected NODE=URL ({example})")
        if node in seen:
            raise NodesUsageError(f"--node-engine: node {node!r} is given twice")
        seen.add(node)
        engine = NodeEngine(url)
        if engine.problems():
            raise NodesUsageError(
                f"--node-engine {value!r}: the URL must start with one of "
                f"{', '.join(s + '://' for s in ENGINE_SCHEMES)} ({example})"
            )
        engines[node] = engine
    if tls_dir is not None:
        for node, engine in engines.items():
            if engine.tls_dir is None and engine.url.startswith("tcp://"):
                engines[node] = NodeEngine(engine.url, tls_dir)
        probe = NodeEngine("tcp://probe:2376", tls_dir).problems()
        if probe:
            raise NodesUsageError(f"--node-tls {tls_dir}: {'; '.join(probe)}")
    return engines


def parse_registry(value: str) -> str:
    """``--registry HOST[:PORT]`` (no scheme, no path): where images are pushed and pulled."""
    host, _, port = value.partition(":")
    ok = bool(host) and "/" not in value and "://" not in value and (not port or port.isdigit())
    if not ok:
        raise NodesUsageError(
            f"--registry {value!r}: expected HOST or HOST:PORT of a Docker registry "
            "(e.g. registry.lab.example:5000), without a scheme or path"
        )
    return value


def registry_ref(registry: str, tag: str) -> tuple[str, str]:
    """(repository, tag) of a catalog image in ``registry``: any registry host the catalog's
    name carries is replaced (``gpulab/base:0.1.0`` -> ``REGISTRY/gpulab/base``, ``0.1.0``)."""
    from docker.utils import parse_repository_tag

    repo, version = parse_repository_tag(tag)
    first, _, rest = repo.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        repo = rest
    return f"{registry}/{repo}", version or "latest"


def resolve_engines(
    nodes: list[SwarmNode], engines: Mapping[str, NodeEngine]
) -> dict[str, NodeEngine]:
    """Node id -> engine: each key given by the operator names exactly one node, by id, by its
    ``gpulab.node`` label or hostname (as the hub's GPULAB_SWARM_NODE_ENGINES does), or by an
    unambiguous id prefix."""
    listing = ", ".join(n.name for n in nodes) or "none"
    out: dict[str, NodeEngine] = {}
    given: dict[str, str] = {}
    for key, engine in engines.items():
        matches = (
            [n for n in nodes if n.id == key]
            or [n for n in nodes if n.label_name == key]
            or [n for n in nodes if n.hostname == key]
        )
        if not matches and len(key) >= 4:
            matches = [n for n in nodes if n.id.startswith(key)]
        if not matches:
            raise NodesUsageError(
                f"--node-engine {key}: no Swarm node has that id, gpulab.node label or hostname; "
                f"nodes: {listing}"
            )
        if len(matches) > 1:
            raise NodesUsageError(
                f"--node-engine {key}: {len(matches)} nodes match ({', '.join(n.name for n in matches)}); "
                "name the node by its id"
            )
        node = matches[0]
        if node.id in out:
            raise NodesUsageError(
                f"--node-engine {key}: node {node.name} already has an engine (as {given[node.id]})"
            )
        out[node.id] = engine
        given[node.id] = key
    return out


# ---- the cluster --------------------------------------------------------------------------------


def manager_client(docker_host: str | None):
    """The hub node's engine (a Swarm manager): ``--docker-host`` or DOCKER_HOST (and its TLS
    variables, as the docker CLI reads them)."""
    import docker
    from docker.utils import kwargs_from_env

    kwargs = kwargs_from_env()
    if docker_host:
        kwargs["base_url"] = docker_host
    try:
        client = docker.DockerClient(version="auto", timeout=120, **kwargs)
        client.ping()
    except docker.errors.DockerException as e:
        where = docker_host or kwargs.get("base_url") or "the default socket"
        raise SystemExit(f"gpulab images: no Docker Engine at {where}: {e}") from None
    return client


def swarm_nodes(client) -> tuple[list[SwarmNode], str]:
    """Every node (the manager's ``docker node ls``) and the id of the node ``client`` runs on."""
    import docker

    info = client.info()
    swarm = info.get("Swarm") or {}
    if not swarm.get("ControlAvailable"):
        state = swarm.get("LocalNodeState") or "inactive"
        raise NodesUsageError(
            f"--nodes/--preload need a Swarm manager's engine; {client.api.base_url} is not one "
            f"(swarm state: {state}): set --docker-host (or DOCKER_HOST) to a manager's socket"
        )
    try:
        nodes = [SwarmNode.from_attrs(n.attrs) for n in client.nodes.list()]
    except docker.errors.APIError as e:
        raise NodesUsageError(f"--docker-host {client.api.base_url}: {e.explanation}") from None
    return sorted(nodes, key=lambda n: (n.id != swarm.get("NodeID"), n.hostname, n.id)), swarm[
        "NodeID"
    ]


@dataclass
class NodeImages:
    """What one node holds of the selected catalog images."""

    node: SwarmNode
    engine: str | None  # its URL; None: the operator gave none
    hub: bool  # the hub's own node (the source of every copy)
    images: dict[str, str] = field(default_factory=dict)  # slug -> present, stale, missing
    error: str = ""  # why its images are unknown

    def to_json(self) -> dict:
        n = self.node
        return {
            "id": n.id,
            "hostname": n.hostname,
            "addr": n.addr,
            "state": n.state,
            "availability": n.availability,
            "role": n.role,
            "labels": n.labels,
            "hub": self.hub,
            "engine": self.engine,
            "images": self.images,
            "error": self.error,
        }


def _connect_checked(node: SwarmNode, engine: NodeEngine):
    """A client for ``node``'s engine, after checking that the engine is that node: a swapped
    address would otherwise report (and fill) the wrong node."""
    client = engine_client(engine, timeout=600)
    try:
        actual = (client.info().get("Swarm") or {}).get("NodeID", "")
    except Exception:
        client.close()
        raise
    if actual != node.id:
        client.close()
        raise WrongEngine(
            f"the engine at {engine.url} is {'node ' + actual[:12] if actual else 'in no swarm'}, "
            f"not {node.name}: check its --node-engine"
        )
    return client


def survey(
    client,
    hub_url: str,
    hub_id: str,
    nodes: list[SwarmNode],
    engines: Mapping[str, NodeEngine],
    tags: Mapping[str, str],
    source_ids: Mapping[str, str | None],
) -> list[NodeImages]:
    """Each node's copy of each image (slug -> catalog tag): present (the hub node's id), stale
    (another image under that tag), missing; unknown where its engine is not given or down."""
    out = []
    for node in nodes:
        hub = node.id == hub_id
        engine = engines.get(node.id)
        row = NodeImages(node, engine.url if engine else hub_url if hub else None, hub)
        out.append(row)
        if not hub and engine is None:
            row.error = f"no engine URL: give --node-engine {handle(node, nodes)}=URL"
            continue
        try:
            node_client = client if hub and engine is None else _connect_checked(node, engine)
        except WrongEngine as e:
            row.error = str(e)
            continue
        except Exception as e:
            row.error = f"engine does not answer: {e}"
            continue
        try:
            for slug, tag in tags.items():
                have = image_id(node_client, tag)
                want = source_ids.get(slug)
                row.images[slug] = (
                    "missing" if have is None else "present" if want in (None, have) else "stale"
                )
        except Exception as e:
            row.error = f"engine does not answer: {e}"
        finally:
            if node_client is not client:
                node_client.close()
    return out


def print_survey(rows: list[NodeImages], tags: Mapping[str, str], out: TextIO) -> None:
    for row in rows:
        n = row.node
        gpu = n.labels.get("gpulab.gpu-type", "-")
        hub = ", the hub's node" if row.hub else ""
        print(
            f"node {n.name}{hub}: {n.role}, {n.state}, {n.availability}, gpu-type {gpu}, "
            f"engine {row.engine or '-'}",
            file=out,
        )
        if row.error:
            print(f"  images unknown: {row.error}", file=out)
        for slug, state in row.images.items():
            print(f"  {slug:<12} {state.upper() if state != 'present' else state:<8} {tags[slug]}", file=out)  # fmt: skip


# ---- copying ------------------------------------------------------------------------------------


class Progress:
    """Progress lines of one copy: node, image, MB so far of about how many, seconds.

    A line at each quarter of the image's size (so that even a fast copy shows it moving, and a
    test can count on them) and, in between, one every ``PROGRESS_EVERY_S`` (a 20 GB CUDA image
    over a slow link takes minutes per quarter)."""

    def __init__(self, node: SwarmNode, slug: str, total: int, out: TextIO) -> None:
        self.node, self.slug, self.total, self.out = node, slug, total, out
        self.start = self.last = time.monotonic()
        self.bytes = 0
        self.quarters = 0  # quarters of ``total`` already reported

    def add(self, n: int) -> None:
        self.bytes += n
        now = time.monotonic()
        # ``docker save`` writes a little more than the image's size (tar headers, manifests):
        # past the last quarter only the timer prints.
        quarter = min(3, self.bytes * 4 // self.total) if self.total > 0 else 0
        if quarter > self.quarters or now - self.last >= PROGRESS_EVERY_S:
            self.quarters = max(self.quarters, quarter)
            self.last = now
            print(
                f"  {self.node.name}: {self.slug} {self.bytes / MB:.1f} of about "
                f"{self.total / MB:.1f} MB, {now - self.start:.1f} s",
                file=self.out,
                flush=True,
            )

    def note(self, what: str) -> None:
        secs = time.monotonic() - self.start
        print(
            f"  {self.node.name}: {self.slug} {self.bytes / MB:.1f} MB {what}, {secs:.1f} s",
            file=self.out,
            flush=True,
        )

    def done(self, how: str) -> str:
        secs = time.monotonic() - self.start
        mb = self.bytes / MB
        rate = f", {mb / secs:.0f} MB/s" if secs > 0 and mb >= 1 else ""
        return f"{self.node.name}: {self.slug} {how}: {mb:.1f} MB in {secs:.1f} s{rate}"


def stream_image(source, target, tag: str, progress: Progress) -> None:
    """``docker save TAG | docker load`` between two engines, through this process: the
    archive flows in the SDK's chunks, nothing is written to disk."""
    image = source.images.get(tag)

    def chunks() -> Iterator[bytes]:
        for chunk in image.save(named=tag):
            progress.add(len(chunk))
            yield chunk
        # The node unpacks the layers after the last byte: say so, the wait is not a hang.
        progress.note("sent, the node is unpacking it")

    target.images.load(chunks())


def push_to_registry(source, tag: str, registry: str, out: TextIO) -> tuple[str, str]:
    """Tag the hub node's image into ``registry`` and push it; (repository, tag) there."""
    repo, version = registry_ref(registry, tag)
    source.images.get(tag).tag(repo, version)
    print(f"  pushing {tag} to {repo}:{version}", file=out, flush=True)
    for line in source.images.push(repo, version, stream=True, decode=True):
        if "error" in line:
            raise RuntimeError(f"push of {repo}:{version} failed: {line['error']}")
    return repo, version


def pull_from_registry(target, ref: tuple[str, str], tag: str, progress: Progress) -> None:
    """Pull the pushed image on a node and give it the catalog's name (the spawner's)."""
    from docker.utils import parse_repository_tag

    repo, version = ref
    for line in target.api.pull(repo, version, stream=True, decode=True):
        if "error" in line:
            raise RuntimeError(f"pull of {repo}:{version} failed: {line['error']}")
    name, catalog_version = parse_repository_tag(tag)
    target.images.get(f"{repo}:{version}").tag(name, catalog_version or "latest")
    progress.bytes = target.images.get(tag).attrs.get("Size", 0)


def check_engines(nodes: list[SwarmNode], hub_id: str, engines: Mapping[str, NodeEngine]) -> None:
    """Every node that is up, but the hub's, needs an engine URL before anything is copied."""
    lacking = [n for n in nodes if n.state == "ready" and n.id != hub_id and n.id not in engines]
    if lacking:
        raise NodesUsageError(
            "--preload: no engine URL for "
            + ", ".join(n.name for n in lacking)
            + "; give "
            + " ".join(f"--node-engine {handle(n, nodes)}=URL" for n in lacking)
            + " (or a --node-engines FILE, or GPULAB_SWARM_NODE_ENGINES): the manager's API cannot "
            "place images on other nodes"
        )


def preload(
    client,
    hub_id: str,
    nodes: list[SwarmNode],
    engines: Mapping[str, NodeEngine],
    tags: Mapping[str, str],
    registry: str | None,
    out: TextIO = sys.stdout,
) -> tuple[int, int]:
    """Make every image (slug -> tag) present on every ready node, from the hub's node.

    Returns (copies made, failures). Every node that is up must have an engine URL, checked
    before anything is copied; nodes that are down are skipped with a line."""
    check_engines(nodes, hub_id, engines)
    up = [n for n in nodes if n.state == "ready"]
    for n in nodes:
        if n.state != "ready":
            print(f"{n.name}: skipped, the node is {n.state}", file=out)
    copied = failed = 0
    source_ids: dict[str, str] = {}
    for slug, tag in tags.items():
        have = image_id(client, tag)
        if have is None:
            print(
                f"{slug}: {tag} is not on the hub's node; build or pull it there first "
                "(gpulab images --build or --pull)",
                file=out,
            )
            failed += 1
        else:
            source_ids[slug] = have
    pushed: dict[str, tuple[str, str]] = {}
    for node in up:
        if node.id == hub_id:
            continue
        try:
            target = _connect_checked(node, engines[node.id])
        except Exception as e:
            print(f"{node.name}: FAILED, engine {engines[node.id].url}: {e}", file=out)
            failed += len(source_ids)
            continue
        try:
            for slug, want in source_ids.items():
                tag = tags[slug]
                have = image_id(target, tag)
                if have == want:
                    print(f"{node.name}: {slug} present ({tag})", file=out, flush=True)
                    continue
                # Stale: the node's tag names another build (an older one, or one built there);
                # a spawn there would run it, so it is replaced like a missing one.
                state = "stale" if have else "missing"
                size = client.images.get(tag).attrs.get("Size", 0)
                progress = Progress(node, slug, size, out)
                print(
                    f"{node.name}: {slug} {state} ({tag}, {size / MB:.1f} MB), "
                    + (f"pulling from {registry}" if registry else "streaming from the hub's node"),
                    file=out,
                    flush=True,
                )
                try:
                    if registry:
                        if slug not in pushed:
                            pushed[slug] = push_to_registry(client, tag, registry, out)
                        pull_from_registry(target, pushed[slug], tag, progress)
                    else:
                        stream_image(client, target, tag, progress)
                    if image_id(target, tag) != want:
                        raise RuntimeError(f"{tag} on the node is not the hub node's {want[:19]}")
                except Exception as e:
                    print(f"{node.name}: {slug} FAILED: {e}", file=out, flush=True)
                    failed += 1
                    continue
                print(progress.done("copied" if not registry else "pulled"), file=out, flush=True)
                copied += 1
        finally:
            target.close()
    return copied, failed


# ---- the command --------------------------------------------------------------------------------


def run_nodes(args, tags: Mapping[str, str], out: TextIO = sys.stdout) -> int:
    """``gpulab images --nodes`` and/or ``--preload`` (``tags``: slug -> catalog tag)."""
    engines = parse_node_engines(
        args.node_engine or [],
        args.node_engines,
        args.node_tls,
        # The hub's own setting, checked by the settings table (a JSON object of strings).
        settings.setting("GPULAB_SWARM_NODE_ENGINES").text(
            settings.get("GPULAB_SWARM_NODE_ENGINES")
        )
        or None,
    )
    registry = parse_registry(args.registry) if args.registry else None
    client = manager_client(args.docker_host)
    hub_url = args.docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        nodes, hub_id = swarm_nodes(client)
        by_id = resolve_engines(nodes, engines)
        failed = 0
        if args.preload:
            check_engines(nodes, hub_id, by_id)
            print(
                f"gpulab images: preloading {', '.join(tags)} on {len(nodes)} nodes "
                + (f"through {registry}" if registry else "by streaming from the hub's node"),
                file=out,
                flush=True,
            )
            copied, failed = preload(client, hub_id, nodes, by_id, tags, registry, out)
            print(f"gpulab images: {copied} copied, {failed} failed", file=out)
        source_ids = {slug: image_id(client, tag) for slug, tag in tags.items()}
        rows = survey(client, hub_url, hub_id, nodes, by_id, tags, source_ids)
    finally:
        client.close()
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=1), file=out)
    else:
        print_survey(rows, tags, out)
    if failed:
        return 1
    # 3 (as for one node): an up node lacks an image or cannot be asked.
    up = [r for r in rows if r.node.state == "ready"]
    complete = all(not r.error and set(r.images.values()) <= {"present"} for r in up)
    return 0 if complete else 3
