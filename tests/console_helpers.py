"""What the operator console's two tests share (issue 24): the API's against the metrics
(tests/e2e/test_console_api.py) and the page's in Chromium (tests/browser/test_console_page.py)
read the same scene on a hub simulating two RTX 4090s: two users holding both on demand, a third
user's spot bid queued for one, and a kernel kept busy so that its simulated card shows busy.
"""

from __future__ import annotations

import uuid

from harness import Hub, Kernel

RTX = "rtx-4090"
# A daemon thread spinning in the kernel: its CPU stays busy and the kernel still answers.
BUSY_LOOP = (
    "import threading\n"
    "def spin():\n"
    "    while True:\n"
    "        pass\n"
    "threading.Thread(target=spin, daemon=True).start()\n"
    "print('spinning')"
)


def spin(kernel: Kernel) -> None:
    """Keep ``kernel``'s CPU busy (the simulated card follows its holder's CPU)."""
    assert "spinning" in kernel.execute(BUSY_LOOP)


def running_with_a_queue(hub: Hub) -> tuple[str, str, str, dict]:
    """Two users on the two RTX 4090s (alice and bob, on demand, spot price 0.40) and carol's spot
    bid (max 0.50) queued for one (no free card): the three names and her place in the queue."""
    assert hub.api("PUT", f"/gpulab/spot/prices/{RTX}", json={"price": "0.40"}).ok
    alice, bob, carol = (hub.create_user(f"{p}{uuid.uuid4().hex[:5]}") for p in "abc")
    hub.spawn_ready(alice, {"gpu": RTX}, timeout=120)
    hub.spawn_ready(bob, {"gpu": RTX}, timeout=120)
    r = hub.spawn(carol, {"gpu": RTX, "pricing": "spot", "max_price": "0.50", "wait": True})
    assert r.status_code == 202, r.text
    return alice, bob, carol, r.json()["queued"]


def clean_up(hub: Hub, users: tuple[str, ...]) -> None:
    """Each user's bid taken out of the queue and server stopped; the spot price back to the
    market's own."""
    for name in users:
        hub.api("DELETE", f"/gpulab/spot/queue/{name}")
        if hub.server(name):
            hub.stop_server(name)
    hub.api("PUT", f"/gpulab/spot/prices/{RTX}", json={"price": None})
