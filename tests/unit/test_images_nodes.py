"""`gpulab images --nodes/--preload`: what an operator gets wrong is refused before anything is
copied, naming the option and what it accepts; registry mode (no registry on the test machine,
so not run on the test swarm) pushes once and pulls on each node under the catalog's name.

The copying itself, by streaming between real engines, is tested on a real swarm in
tests/swarm/test_swarm_images.py.
"""

from __future__ import annotations

import io
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from harness import VENV_BIN

from gpulab.hub_config.cli import images_nodes
from gpulab.hub_config.cli.images_nodes import (
    NodesUsageError,
    Progress,
    SwarmNode,
    check_engines,
    handle,
    parse_node_engines,
    parse_registry,
    preload,
    read_node_engines_file,
    registry_ref,
    resolve_engines,
)
from gpulab.spawners.docker.images import NodeEngine


def node(ident: str, hostname: str = "gpu", state: str = "ready") -> SwarmNode:
    return SwarmNode(ident, hostname, "10.0.0.1", state, "active", "worker")


NODES = [
    node("aaaa1111manager", "hub"),
    node("bbbb2222", "gpu-1"),
    node("cccc3333", "twin"),
    node("cccc4444", "twin"),
]


def gpulab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "gpulab"), *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


# ---- options ------------------------------------------------------------------------------------


def test_node_engine_values_are_parsed_and_bad_ones_named() -> None:
    got = parse_node_engines(["gpu-1=tcp://10.0.0.12:2376", "gpu-2 = ssh://ops@gpu-2"])
    assert got == {
        "gpu-1": NodeEngine("tcp://10.0.0.12:2376"),
        "gpu-2": NodeEngine("ssh://ops@gpu-2"),
    }
    with pytest.raises(NodesUsageError) as e:
        parse_node_engines(["gpu-1"])
    assert str(e.value) == (
        "--node-engine 'gpu-1': expected NODE=URL (e.g. gpu-node-1=tcp://10.0.0.12:2376)"
    )
    with pytest.raises(NodesUsageError) as e:
        parse_node_engines(["gpu-1=http://10.0.0.12:2375"])
    assert "the URL must start with one of unix://, tcp://, ssh://" in str(e.value)
    with pytest.raises(NodesUsageError, match="node 'gpu-1' is given twice"):
        parse_node_engines(["gpu-1=tcp://a:2376", "gpu-1=tcp://b:2376"])


def test_node_engines_file_json_and_toml(tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    tls.mkdir()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tls / name).write_text("x")
    js = tmp_path / "engines.json"
    js.write_text(json.dumps({"gpu-1": "tcp://10.0.0.12:2376"}))
    assert read_node_engines_file(str(js)) == {"gpu-1": NodeEngine("tcp://10.0.0.12:2376")}
    # A TOML file may hold other settings: the table is then under `node_engines`.
    toml = tmp_path / "gpulab.toml"
    toml.write_text(
        "[node_engines]\n"
        f'gpu-1 = {{ url = "tcp://10.0.0.12:2376", tls_dir = "{tls}" }}\n'
        'gpu-2 = "unix:///run/gpu-2.sock"\n'
    )
    assert read_node_engines_file(str(toml)) == {
        "gpu-1": NodeEngine("tcp://10.0.0.12:2376", str(tls)),
        "gpu-2": NodeEngine("unix:///run/gpu-2.sock"),
    }
    # --node-engine wins over the file's entry for the same node.
    got = parse_node_engines(["gpu-2=ssh://gpu-2"], str(toml))
    assert got["gpu-2"] == NodeEngine("ssh://gpu-2")


def test_the_hubs_node_engines_serve_the_command_too(tmp_path: Path) -> None:
    """GPULAB_SWARM_NODE_ENGINES, set for the hub, is read; a file and flags override it."""
    hub = '{"gpu-1": "tcp://10.0.0.12:2376", "gpu-2": "tcp://10.0.0.13:2376"}'
    path = tmp_path / "e.json"
    path.write_text('{"gpu-2": "ssh://gpu-2"}')
    got = parse_node_engines(["gpu-3=tcp://10.0.0.14:2376"], str(path), hub_json=hub)
    assert got == {
        "gpu-1": NodeEngine("tcp://10.0.0.12:2376"),
        "gpu-2": NodeEngine("ssh://gpu-2"),
        "gpu-3": NodeEngine("tcp://10.0.0.14:2376"),
    }
    with pytest.raises(NodesUsageError) as e:
        parse_node_engines([], hub_json='["tcp://a"]')
    assert str(e.value).startswith("GPULAB_SWARM_NODE_ENGINES: expected a JSON object of NODE")
    with pytest.raises(NodesUsageError) as e:
        parse_node_engines([], hub_json='{"gpu-1": "10.0.0.12"}')
    assert "GPULAB_SWARM_NODE_ENGINES: node 'gpu-1': URL '10.0.0.12' must start with" in str(
        e.value
    )


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("e.json", "{", "--node-engines {path}: not valid JSON"),
        ("e.toml", "gpu-1 = ", "--node-engines {path}: not valid TOML (name it .json for JSON)"),
        ("e.json", "[1]", "--node-engines {path}: expected a table of NODE = URL"),
        (
            "e.json",
            '{"gpu-1": {"url": "tcp://a:2376", "tls": "/x"}}',
            "node 'gpu-1' must be a URL string or a table with `url` (and optionally `tls_dir`); "
            "unknown key tls",
        ),
        (
            "e.json",
            '{"gpu-1": "10.0.0.12:2376"}',
            "node 'gpu-1': URL '10.0.0.12:2376' must start with one of unix://, tcp://, ssh://",
        ),
        (
            "e.json",
            '{"gpu-1": {"url": "unix:///s.sock", "tls_dir": "{dir}"}}',
            "TLS applies to tcp:// engines only, not 'unix:///s.sock'",
        ),
    ],
)
def test_bad_node_engines_file_is_refused_naming_the_entry(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text.replace("{dir}", str(tmp_path)))
    with pytest.raises(NodesUsageError) as e:
        read_node_engines_file(str(path))
    assert message.replace("{path}", str(path)) in str(e.value)


def test_node_tls_needs_the_three_files(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("x")
    with pytest.raises(NodesUsageError) as e:
        parse_node_engines(["gpu-1=tcp://a:2376"], tls_dir=str(tmp_path))
    assert (
        str(e.value) == f"--node-tls {tmp_path}: TLS directory {tmp_path} lacks cert.pem, key.pem"
    )


def test_registry_option() -> None:
    assert parse_registry("registry.lab:5000") == "registry.lab:5000"
    for bad in ("http://registry.lab:5000", "registry.lab:port", "registry.lab/x", ""):
        with pytest.raises(NodesUsageError) as e:
            parse_registry(bad)
        assert "expected HOST or HOST:PORT of a Docker registry" in str(e.value)
    # The catalog's own registry host is replaced by the operator's.
    assert registry_ref("reg:5000", "gpulab/base:0.1.0") == ("reg:5000/gpulab/base", "0.1.0")
    assert registry_ref("reg:5000", "ghcr.io/lab/pytorch:2") == ("reg:5000/lab/pytorch", "2")
    assert registry_ref("reg:5000", "localhost:5000/x") == ("reg:5000/x", "latest")


def test_engines_resolve_to_exactly_one_node_each() -> None:
    engines = {
        "gpu-1": NodeEngine("tcp://b:2376"),
        "cccc4444": NodeEngine("tcp://d:2376"),
        "cccc3": NodeEngine("tcp://c:2376"),
    }
    assert resolve_engines(NODES, engines) == {
        "bbbb2222": NodeEngine("tcp://b:2376"),
        "cccc4444": NodeEngine("tcp://d:2376"),
        "cccc3333": NodeEngine("tcp://c:2376"),
    }
    with pytest.raises(NodesUsageError) as e:
        resolve_engines(NODES, {"twin": NodeEngine("tcp://c:2376")})
    assert "--node-engine twin: 2 nodes match" in str(e.value)
    assert "name the node by its id" in str(e.value)
    with pytest.raises(NodesUsageError) as e:
        resolve_engines(NODES, {"gpu-9": NodeEngine("tcp://c:2376")})
    assert (
        "--node-engine gpu-9: no Swarm node has that id, gpulab.node label or hostname; nodes: hub ("
        in str(e.value)
    )
    with pytest.raises(NodesUsageError, match="already has an engine"):
        resolve_engines(NODES, {"gpu-1": NodeEngine("tcp://b"), "bbbb2222": NodeEngine("tcp://b")})
    # What the error messages suggest as NODE: a unique hostname, else the id.
    assert [handle(n, NODES) for n in NODES] == ["hub", "gpu-1", "cccc3333", "cccc4444"]


def test_preload_needs_an_engine_for_every_node_that_is_up() -> None:
    nodes = [*NODES[:2], node("dddd5555", "gone", state="down")]
    with pytest.raises(NodesUsageError) as e:
        check_engines(nodes, "aaaa1111manager", {})
    assert str(e.value).startswith(
        "--preload: no engine URL for gpu-1 (bbbb2222); give --node-engine gpu-1=URL"
    )
    # The hub's node is the source; a node that is down is skipped, not a reason to refuse.
    check_engines(nodes, "aaaa1111manager", {"bbbb2222": NodeEngine("tcp://b:2376")})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--registry", "reg:5000"], "--registry is used by --preload only (add --preload)"),
        (["--node-engine", "a=tcp://a:1"], "--node-engine is used by --nodes and --preload only"),
        (["--preload", "--all"], "--all does not apply to --preload"),
    ],
)
def test_cli_refuses_options_that_do_not_go_together(
    tmp_path: Path, args: list[str], message: str
) -> None:
    # Refused before any engine is asked: none is given here.
    r = gpulab("images", "--docker-host", "unix:///nonexistent.sock", *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr


def test_progress_reports_each_quarter() -> None:
    out = io.StringIO()
    p = Progress(node("bbbb2222", "gpu-1"), "base", 8 * 2**20, out)
    for _ in range(8):
        p.add(2**20)
    lines = out.getvalue().splitlines()
    assert lines == [
        f"  gpu-1 (bbbb2222): base {mb:.1f} of about 8.0 MB, {line.rsplit(', ', 1)[1]}"
        for mb, line in zip((2, 4, 6), lines, strict=True)
    ]
    assert p.done("copied").startswith("gpu-1 (bbbb2222): base copied: 8.0 MB in ")


# ---- registry mode, with engines that record what they were asked ------------------------------


@dataclass
class FakeImage:
    id: str
    size: int = 3 * 2**20
    engine: FakeEngine | None = None

    @property
    def attrs(self) -> dict:
        return {"Size": self.size}

    def tag(self, repo: str, version: str) -> None:
        self.engine.tags[f"{repo}:{version}"] = self.id
        self.engine.calls.append(("tag", f"{repo}:{version}"))


@dataclass
class FakeEngine:
    node_id: str
    tags: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    registry: dict[str, str] | None = None  # shared "registry": ref -> id

    @property
    def images(self) -> FakeEngine:
        return self

    @property
    def api(self) -> FakeEngine:
        return self

    def get(self, tag: str) -> FakeImage:
        import docker.errors

        if tag not in self.tags:
            raise docker.errors.ImageNotFound(tag)
        return FakeImage(self.tags[tag], engine=self)

    def push(self, repo: str, version: str, stream: bool, decode: bool):
        self.calls.append(("push", f"{repo}:{version}"))
        self.registry[f"{repo}:{version}"] = self.tags[f"{repo}:{version}"]
        yield {"status": "Pushed"}

    def pull(self, repo: str, version: str, stream: bool, decode: bool):
        self.calls.append(("pull", f"{repo}:{version}"))
        self.tags[f"{repo}:{version}"] = self.registry[f"{repo}:{version}"]
        yield {"status": "Downloaded newer image"}

    def info(self) -> dict:
        return {"Swarm": {"NodeID": self.node_id}}

    def close(self) -> None:
        pass


def test_registry_mode_pushes_once_and_pulls_under_the_catalog_name(monkeypatch) -> None:
    registry: dict[str, str] = {}
    hub = FakeEngine("aaaa1111manager", {"gpulab/base:1": "sha256:new"}, registry=registry)
    missing = FakeEngine("bbbb2222", registry=registry)
    stale = FakeEngine("cccc3333", {"gpulab/base:1": "sha256:old"}, registry=registry)
    current = FakeEngine("cccc4444", {"gpulab/base:1": "sha256:new"}, registry=registry)
    by_url = {"tcp://b": missing, "tcp://c": stale, "tcp://d": current}
    monkeypatch.setattr(images_nodes, "engine_client", lambda e, timeout: by_url[e.url])
    engines = {
        n: NodeEngine(u) for n, u in zip(("bbbb2222", "cccc3333", "cccc4444"), by_url, strict=True)
    }
    out = io.StringIO()

    copied, failed = preload(
        hub, NODES[0].id, NODES, engines, {"base": "gpulab/base:1"}, "r:5000", out
    )

    assert (copied, failed) == (2, 0), out.getvalue()
    assert [c for c in hub.calls if c[0] == "push"] == [("push", "r:5000/gpulab/base:1")]
    for engine in (missing, stale):
        assert engine.calls == [("pull", "r:5000/gpulab/base:1"), ("tag", "gpulab/base:1")]
        assert engine.tags["gpulab/base:1"] == "sha256:new"
    assert current.calls == []
    text = out.getvalue()
    assert "gpu-1 (bbbb2222): base missing (gpulab/base:1, 3.0 MB), pulling from r:5000" in text
    assert "twin (cccc3333): base stale (gpulab/base:1, 3.0 MB), pulling from r:5000" in text
    assert "twin (cccc4444): base present (gpulab/base:1)" in text


def test_an_engine_at_the_wrong_address_is_not_filled(monkeypatch) -> None:
    """Two addresses swapped in the operator's list: each engine says which node it is."""
    hub = FakeEngine("aaaa1111manager", {"gpulab/base:1": "sha256:new"})
    other = FakeEngine("cccc3333")
    monkeypatch.setattr(images_nodes, "engine_client", lambda e, timeout: other)
    out = io.StringIO()
    copied, failed = preload(
        hub,
        NODES[0].id,
        NODES[:2],
        {"bbbb2222": NodeEngine("tcp://c")},
        {"base": "gpulab/base:1"},
        None,
        out,
    )
    assert (copied, failed) == (0, 1)
    assert (
        "gpu-1 (bbbb2222): FAILED, engine tcp://c: the engine at tcp://c is node cccc3333, "
        "not gpu-1 (bbbb2222): check its --node-engine" in out.getvalue()
    )
    assert other.tags == {}


def test_nodes_are_named_by_their_gpulab_node_label_as_the_hub_names_them() -> None:
    """Nodes cloned from one image share a hostname; the hub's `gpulab.node` label tells them
    apart, and an engine list written for the hub (keyed by it) serves `gpulab images` too."""
    twins = [
        SwarmNode(
            "eeee5555", "gpu", "10.0.0.5", "ready", "active", "worker", {"gpulab.node": "g1"}
        ),
        SwarmNode(
            "ffff6666", "gpu", "10.0.0.6", "ready", "active", "worker", {"gpulab.node": "g2"}
        ),
    ]
    assert resolve_engines(twins, {"g2": NodeEngine("tcp://f:2376")}) == {
        "ffff6666": NodeEngine("tcp://f:2376")
    }
    assert [handle(n, twins) for n in twins] == ["g1", "g2"]
    assert twins[0].name == "g1 (eeee5555)"
