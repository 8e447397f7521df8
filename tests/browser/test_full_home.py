"""Issue 23, part A, point 5: a full home is not a lock-out, in a real Chromium.

alice's home (a 64 MiB image: the kernel enforces it) is filled to the byte by her own kernel:
fallocate until ENOSPC, then ever smaller pieces, then one-byte files until ENOSPC. Her server
then starts again, JupyterLab opens in Chromium with no console error (its runtime files, cookie
secret and the apps' config live in the server's own /tmp, outside the quota), she deletes a file
through the contents API and can write again. On the old code nothing refused the fill at all
(the home was the node's disk); with images but the runtime files in the home, the server could
not start on a full home.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import requests
from harness import (
    FAST_BILLING_ENV,
    PASSWORD,
    REPO,
    SLOW,
    Hub,
    approved_user,
    browser_log_in,
    catalog_with,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="homes are loop-mounted images as root")

SHOTS = Path(os.environ.get("GPULAB_SCREENSHOTS", REPO / "artifacts" / "screenshots"))
MiB = 2**20

FILL_TO_THE_BYTE = """
import errno, json, os
os.makedirs("tiny", exist_ok=True)
steps = {}
def fill_with(size, limit):
    n = 0
    try:
        fd = os.open(f"fill-{size}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            while n < limit:
                os.posix_fallocate(fd, os.fstat(fd).st_size, size); n += 1
        finally:
            os.close(fd)
        return "NOT-REFUSED"
    except OSError as e:
        return errno.errorcode[e.errno]
for size, limit in ((2**20, 80), (2**16, 64), (2**12, 64), (2**10, 64)):
    steps[size] = fill_with(size, limit)
n, tiny = 0, "NOT-REFUSED"
try:
    while n < 100_000:
        with open(f"tiny/{n}", "w") as f:
            f.write("x")
        n += 1
except OSError as e:
    tiny = errno.errorcode[e.errno]
v = os.statvfs(".")
print(json.dumps({"steps": steps, "tiny": tiny, "tiny_files": n, "bavail": v.f_bavail}))
"""


def full_catalog(folder: Path) -> Path:
    """The shipped catalog with a 64 MiB free home."""
    return catalog_with(folder, free_gb=0.0625, max_gb=1)


def test_a_home_full_to_the_byte_still_opens_jupyterlab(hub_factory, tmp_path, browser) -> None:
    hub: Hub = hub_factory(
        "full-home", simulate="RTX-4090:1", catalog=full_catalog(tmp_path), env=FAST_BILLING_ENV
    )
    alice = approved_user(hub, "alice", PASSWORD)
    SHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 820})
    page = context.new_page()
    errors: list[str] = []
    try:
        browser_log_in(page, hub, alice, PASSWORD, timeout=SLOW)
        hub.spawn_ready(alice, {"gpu": "none"})
        with hub.kernel(alice) as k:
            out = k.execute(FILL_TO_THE_BYTE, timeout=240).strip().splitlines()[-1]
        filled = json.loads(out)
        assert filled["steps"][str(MiB)] == "ENOSPC" and filled["tiny"] == "ENOSPC", filled
        assert filled["bavail"] == 0, filled
        home = hub.data_dir / "users" / alice
        assert os.statvfs(home).f_bavail == 0
        hub.stop_server(alice)

        hub.spawn_ready(alice, {"gpu": "none"}, timeout=SLOW / 1000)
        assert os.statvfs(home).f_bavail == 0  # still full: the start needed no room there

        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(hub.user_url(alice, "lab"), timeout=SLOW)
        page.locator(".jp-DirListing-item", has_text="tiny").wait_for(timeout=SLOW)
        page.locator("#gpulab-status").wait_for(timeout=SLOW)
        page.screenshot(path=str(SHOTS / "full-home-jupyterlab.png"), animations="disabled")
    finally:
        context.close()
    assert not errors, errors

    headers = {"Authorization": f"token {hub.token}"}
    r = requests.delete(
        hub.user_url(alice, "api/contents/fill-1048576"), headers=headers, timeout=60
    )
    assert r.status_code == 204, r.text
    assert os.statvfs(home).f_bavail * os.statvfs(home).f_frsize > 32 * MiB
    with hub.kernel(alice) as k:
        out = k.execute("print(open('after.txt', 'w').write('room again' * 1000))").strip()
    assert out == "10000"
