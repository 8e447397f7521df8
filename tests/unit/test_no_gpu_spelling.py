"""'No GPU' has one spelling (issue 21): ``gpulab.catalog.NO_GPU``, compared by name everywhere.

The user's choice of GPU type is a string on every floor (a catalog slug, or NO_GPU); only the
allocator's cards-held type keeps None ("holds no cards"), crossing over through ``card_type`` and
``gpu_choice``. The first test reads the hub's, the spawners' and billing's sources and fails on a
bare no-GPU comparison, so a new one cannot slip in.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpulab.billing_service.models import MICRO
from gpulab.billing_service.rating import PriceBook
from gpulab.billing_service.schemas import parse_batch
from gpulab.catalog import NO_GPU, card_type, gpu_choice, load_catalog
from gpulab.spawners.node.allocator import GpuAllocator
from gpulab.spawners.node.inventory import parse_simulate_spec, simulated_devices

REPO = Path(__file__).resolve().parents[2]
# Code in users' servers (spawners/inside/, extensions/) reads GPULAB_GPU_TYPE on its own.
FOLDERS = ("catalog", "hub_config", "spawners", "billing_service")
SKIP = ("spawners/inside/", "catalog/no_gpu.py")  # the one declaration
WORD = r"""["']none["']"""
EMPTY = r"""["']{2}"""
BARE = [
    re.compile(rf"[=!]=\s*{WORD}"),  # x == "none"
    re.compile(rf"{WORD}\s*[=!]="),  # "none" == x
    re.compile(rf"\bin\s*[\(\[\{{][^)\]}}]*{WORD}"),  # x in ("", "none")
    re.compile(rf"gpu\w*\s+or\s+{WORD}"),  # alloc.gpu_type or "none"
    re.compile(rf"gpu\w*\s*[=!]=\s*{EMPTY}"),  # gpu_type == ""
    re.compile(rf"gpu\w*\s+(?:not\s+)?in\s*[\(\[\{{]\s*{EMPTY}"),  # gpu_type in ("", …)
]
# The same word meaning "off" for settings, not "no GPU": --simulate-gpus=none (never simulate
# cards) and --subdomain-host=none (no user origins).
NOT_NO_GPU = {
    ("hub_config/cli/main.py", 'if spec == "none":'),
    ("hub_config/cli/main.py", 'if args.simulate_gpus not in ("auto", "none"):'),
    ("hub_config/config.py", 'simulate_gpus="" if simulate in ("auto", "none") else simulate,'),
    ("hub_config/origin.py", 'if value.strip().lower() == "none":'),
}


def _sources():
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if not rel.startswith(SKIP):
                yield rel, path.read_text()


def test_no_bare_no_gpu_comparison_in_the_hub_spawners_or_billing() -> None:
    found = []
    seen_allowed = set()
    for rel, text in _sources():
        for n, line in enumerate(text.splitlines(), 1):
            if not any(p.search(line) for p in BARE):
                continue
            if (rel, line.strip()) in NOT_NO_GPU:
                seen_allowed.add((rel, line.strip()))
                continue
            found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "compare with gpulab.catalog.NO_GPU, not a bare word:\n" + "\n".join(found)
    # A stale exception would hide nothing but should go: keep the list true.
    assert seen_allowed == NOT_NO_GPU


@pytest.mark.parametrize(
    "line",
    [
        'if gpu == "none":',
        "if opts.gpu != 'none':",
        'if gpu_type in ("", "none"):',
        'cards = gpus if gpu_type not in ("", "none") else 1',
        'L_GPU_TYPE: alloc.gpu_type or "none",',
        'if gpu_type == "":',
    ],
)
def test_the_check_catches_the_old_spellings(line: str) -> None:
    assert any(p.search(line) for p in BARE)


def test_the_choice_and_the_cards_cross_through_one_pair() -> None:
    assert card_type(NO_GPU) is None and gpu_choice(None) == NO_GPU
    assert card_type("a100-80g") == "a100-80g" == gpu_choice("a100-80g")


def test_a_ledger_written_with_null_for_a_no_gpu_server_still_loads(tmp_path) -> None:
    catalog = load_catalog()
    devices = simulated_devices(parse_simulate_spec("A100-80G:1", catalog), catalog, 0)
    path = tmp_path / "ledger.json"
    record = {"alloc_id": "a-1", "owner": "alice/", "gpu_type": None, "uuids": [], "created": 1.0}
    path.write_text(json.dumps({"allocations": [record], "holds": []}))
    alloc = GpuAllocator(devices, path).get("alice/")
    assert alloc is not None and alloc.gpu_type is None and gpu_choice(alloc.gpu_type) == NO_GPU
    # What the allocator writes for a no-GPU server now is the same null.
    fresh = GpuAllocator(devices, tmp_path / "new.json")
    fresh.allocate("bob/", card_type(NO_GPU), 0)
    saved = json.loads((tmp_path / "new.json").read_text())["allocations"]
    assert [r["gpu_type"] for r in saved] == [None]


@pytest.mark.parametrize("gpu", [{"gpu": ""}, {"gpu": None}, {}])
def test_billing_reads_an_empty_or_missing_gpu_as_no_gpu_at_the_edge(gpu: dict) -> None:
    event = {"id": "s-1", "kind": "server_start", "user": "alice", "t": 1767225600.0}
    event |= {"gpus": 0, "pricing": "on-demand", **gpu}
    (start,) = parse_batch({"events": [event]}, 1767225600.0)
    assert start.gpu == NO_GPU


def test_the_rating_knows_only_no_gpu() -> None:
    catalog = load_catalog()
    prices = PriceBook(catalog)
    hour = 3_600_000_000
    rated = prices.rate(NO_GPU, 0, "on-demand", [(0, hour)])
    assert rated.amount_micro == catalog.no_gpu.price_per_hour * MICRO
