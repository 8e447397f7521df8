"""What the kernel-enforced quota costs: a write-heavy workload in an image home vs a plain folder,
and the hub's usage scan of many homes (issue 23).

Homes are loop-mounted ext4 images where the hub is root (``spawners/storage/loopfs.py``). This
benchmark runs, in the same run and on the same disk:

- ``write``: 256 MiB in 1 MiB writes, fsync at the end; then ``small``: 5,000 files of 4 KiB
  created, then deleted. In an image-backed home (the quota enforced) and in a plain folder on
  the host's disk next to it (no quota: the peer). p50/p95 over ``--rounds``.
- ``scan``: ``HomeStore.scan()`` over ``--homes`` homes of ``--files`` small files each, as the
  storage API and billing's meter call it: image homes mounted (one ``statvfs`` each), the same
  images unmounted (each image's ext4 superblock read), and plain folders walked (the directory
  backend, which enforces nothing: the peer). p50/p95 over ``--scans``.

    sudo .venv/bin/python benchmarks/storage_quota.py --rounds 5 --homes 1000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from decimal import Decimal
from pathlib import Path

from gpulab.catalog.models import Storage
from gpulab.spawners.storage.homes import HomeStore
from gpulab.spawners.storage.loopfs import make_image, unmount_below

MiB = 2**20


def p50_p95(values: list[float]) -> tuple[float, float]:
    if len(values) == 1:
        return values[0], values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return statistics.median(values), cuts[94]


def write_big(folder: Path, mib: int) -> float:
    block = os.urandom(MiB)
    t0 = time.perf_counter()
    with open(folder / "big", "wb") as f:
        for _ in range(mib):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    took = time.perf_counter() - t0
    os.unlink(folder / "big")
    return took


def small_files(folder: Path, n: int) -> float:
    data = b"s" * 4096
    sub = folder / "small"
    sub.mkdir()
    t0 = time.perf_counter()
    for i in range(n):
        with open(sub / str(i), "wb") as f:
            f.write(data)
    for i in range(n):
        os.unlink(sub / str(i))
    took = time.perf_counter() - t0
    sub.rmdir()
    return took


def report(title: str, rows: dict[str, list[float]], peer: str) -> None:
    print(f"\n{title}")
    base = p50_p95(rows[peer])[0]
    for name, values in rows.items():
        p50, p95 = p50_p95(values)
        print(
            f"  {name:<28} p50 {p50 * 1000:9.1f} ms   p95 {p95 * 1000:9.1f} ms   x{p50 / base:.2f}"
        )


def bench_writes(root: Path, rounds: int, mib: int, files: int) -> None:
    storage = Storage(free_gb=Decimal(mib * 2) / 1024, max_gb=Decimal(4))
    store = HomeStore(root / "image", storage, mode="image")
    home = store.ensure("bench")
    plain = root / "plain"
    plain.mkdir()
    write = {"image home (quota)": [], "plain folder (no quota)": []}
    small = {"image home (quota)": [], "plain folder (no quota)": []}
    for _ in range(rounds):
        for name, folder in (("image home (quota)", home), ("plain folder (no quota)", plain)):
            write[name].append(write_big(folder, mib))
            small[name].append(small_files(folder, files))
    report(f"{mib} MiB in 1 MiB writes + fsync ({rounds} rounds)", write, "plain folder (no quota)")
    report(f"{files} files of 4 KiB created and deleted", small, "plain folder (no quota)")


def make_homes(store: HomeStore, n: int, files: int, image: bool) -> None:
    for i in range(n):
        name = f"u{i:05d}"
        home = store.ensure(name) if image else store.path(name)
        home.mkdir(parents=True, exist_ok=True)
        for j in range(files):
            (home / f"f{j}").write_bytes(b"d" * (1024 * (j + 1)))


def timed_scans(store: HomeStore, scans: int, n: int) -> list[float]:
    out = []
    for _ in range(scans):
        t0 = time.perf_counter()
        got = store.scan()
        out.append(time.perf_counter() - t0)
        assert len(got) == n, len(got)
    return out


def bench_scan(root: Path, homes: int, files: int, scans: int) -> None:
    storage = Storage(free_gb=Decimal("0.015625"), max_gb=Decimal(1))
    images = HomeStore(root / "scan-image", storage, mode="image")
    plain = HomeStore(root / "scan-plain", storage, mode="directory")
    t0 = time.perf_counter()
    make_homes(images, homes, files, image=True)
    made = time.perf_counter() - t0
    print(f"\nmade and mounted {homes} image homes (16 MiB each) in {made:.1f} s")
    make_homes(plain, homes, files, image=False)
    rows = {"image, mounted (statvfs)": timed_scans(images, scans, homes)}
    # Homes that are not mounted (made, never mounted: a server's mount namespace that started
    # meanwhile may hold a mounted one): their images' superblocks are read.
    offline = HomeStore(root / "scan-offline", storage, mode="image")
    offline.images.images_dir.mkdir(parents=True, mode=0o700)
    for i in range(homes):
        make_image(offline.images.image(f"u{i:05d}"), storage.free_bytes)
    rows["image, unmounted (superblock)"] = timed_scans(offline, scans, homes)
    rows["directory (walk, no quota)"] = timed_scans(plain, scans, homes)
    report(
        f"HomeStore.scan() of {homes} homes, {files} files each", rows, "directory (walk, no quota)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/gpulab-bench-storage", help="scratch folder")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--small", type=int, default=5000)
    ap.add_argument("--homes", type=int, default=1000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--scans", type=int, default=5)
    ap.add_argument("--only", choices=("write", "scan"), help="run one part only")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (loop mounts)")
    root = Path(args.dir)
    unmount_below(root)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, mode=0o700)
    try:
        if args.only != "scan":
            bench_writes(root, args.rounds, args.mib, args.small)
        if args.only != "write":
            bench_scan(root, args.homes, args.files, args.scans)
    finally:
        unmount_below(root)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
