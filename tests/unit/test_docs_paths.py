"""Every path and module the docs and docstrings name exists.

The map (``docs/architecture.md``), the READMEs and the modules' docstrings point readers at
files (``spawners/local/spawner.py``, ``tests/e2e/test_lti.py``) and modules
(``gpulab.hub_config.courses.lti``). When a file moves, the references must move with it: a
reader sent to a path that no longer exists loses the thread. Placeholders in capitals
(``images/SLUG/Dockerfile``, ``/user/NAME/``) are not paths.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess

from harness import REPO

ROOTS = ("tests", "hub_config", "spawners", "billing_service", "catalog", "extensions", "images")
ROOTS += ("benchmarks", "docs", ".ci")
_ROOT_ALTERNATIVES = "|".join(map(re.escape, ROOTS))
PATH_RE = re.compile(r"(?<![\w./-])((?:" + _ROOT_ALTERNATIVES + r")/[\w./-]*[\w/])")
TEST_FILE_RE = re.compile(r"(?<![\w/])(test_\w+\.py)")
MODULE_RE = re.compile(
    r"(?<![\w.])(gpulab\.(?:catalog|hub_config|spawners|billing_service)(?:\.\w+)*)"
)
# Named on purpose although absent: what an error message says about a missing file.
ABSENT_ON_PURPOSE = {"images/broken/Dockerfile"}
# JupyterHub's own test file, which tests/e2e/test_jupyterhub_spawner_contract.py runs.
FOREIGN_TEST_FILES = {"test_spawner.py"}
SUFFIXES = (".md", ".py", ".toml", ".yml", ".yaml", ".sh", ".ts", ".html", ".js", ".cfg")


def _texts() -> dict[str, str]:
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    texts = {}
    for f in files:
        if "/build/" in f or "node_modules" in f or f.endswith("yarn.lock"):
            continue
        if f.endswith(SUFFIXES) or f in ("Makefile", ".ci/run"):
            texts[f] = (REPO / f).read_text(encoding="utf-8", errors="replace")
    return texts


def _placeholder(path: str) -> bool:
    return "..." in path or any(
        re.fullmatch(r"[A-Z][A-Z_]*(\.\w+)?", seg) for seg in path.split("/")
    )


def test_every_named_path_exists():
    missing = {}
    for f, text in _texts().items():
        for m in PATH_RE.finditer(text):
            path = m.group(1).rstrip(".")
            if _placeholder(path) or path in ABSENT_ON_PURPOSE or (REPO / path).exists():
                continue
            missing.setdefault(path, set()).add(f)
    assert not missing, "paths named in docs or code that do not exist:\n" + "\n".join(
        f"  {p}  (named in {', '.join(sorted(fs))})" for p, fs in sorted(missing.items())
    )


def test_every_named_test_file_exists():
    tests = {p.name for p in (REPO / "tests").rglob("test_*.py")}
    missing = {}
    for f, text in _texts().items():
        for m in TEST_FILE_RE.finditer(text):
            name = m.group(1)
            if name not in tests and name not in FOREIGN_TEST_FILES:
                missing.setdefault(name, set()).add(f)
    assert not missing, "test files named that do not exist:\n" + "\n".join(
        f"  {n}  (named in {', '.join(sorted(fs))})" for n, fs in sorted(missing.items())
    )


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        module = ".".join(parts[:i])
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            obj = importlib.import_module(module)
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                return False
            return True
    return False


def test_every_named_module_exists():
    missing = {}
    for f, text in _texts().items():
        for m in MODULE_RE.finditer(text):
            if not _resolves(m.group(1)):
                missing.setdefault(m.group(1), set()).add(f)
    assert not missing, "modules named that do not exist:\n" + "\n".join(
        f"  {n}  (named in {', '.join(sorted(fs))})" for n, fs in sorted(missing.items())
    )
