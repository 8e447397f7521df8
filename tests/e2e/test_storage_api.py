"""The hub's storage API against a real hub and its billing service (issue 23, part C).

Points of issue 23 covered (each test failed on the code before: there was no storage API at all,
so every call below was a 404 and no quota could be seen or raised):

- "Visible": a user sees their home's usage against its quota, as the hub measured it, with when
  (``measured_at``), the free size and the price per GB-day; the notice levels at 80 % / 95 %.
- "an admin's view of the largest homes": ``GET /hub/api/storage``, largest first; billing's and
  admins' only, like the page ``/hub/gpulab/storage``.
- "a user can raise their quota up to an operator's limit", and "the enforcer's money rules apply
  to it": bad values are a 400 naming ``quota_gb``, below what the home holds a 409, beyond what
  the balance pays for a day a 402, and nothing changes on any refusal; a GET never changes the
  quota or charges anything.
- The threat model: another user (or another user's server) reads nothing of a home; code in a
  user's own server (its token) reads its own figure but cannot raise the quota (that costs money).
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
import requests
from billing.client import Billing
from course_helpers import token_for
from harness import (
    FAST_BILLING_ENV,
    PASSWORD,
    Hub,
    WebSession,
    admin_web,
    approved_user,
    catalog_with,
    wait_for,
)

MiB = 2**20
GiB = 2**30
FREE_GB = "0.0625"  # 64 MiB: tests fill it in seconds
MAX_GB = "4"
PRICE = "2.00"  # per GB-day: 1 GB costs 1.875 a day above the free size
TRIAL = "1.00"


def tiny_catalog(folder) -> object:
    """The shipped catalog with a tiny home, a high storage price and a small trial credit."""
    return catalog_with(
        folder,
        free_gb=Decimal(FREE_GB),
        max_gb=Decimal(MAX_GB),
        price_per_gb_day=PRICE,
        trial_credit=TRIAL,
    )


@pytest.fixture(scope="module")
def shub(module_hub_factory, tmp_path_factory) -> Hub:
    hub = module_hub_factory(
        "storage-api",
        simulate="RTX-4090:1",
        catalog=tiny_catalog(tmp_path_factory.mktemp("storage-catalog")),
        env=FAST_BILLING_ENV,
        extra_args=["--StorageAPI.cache_seconds=3"],
    )
    wait_for(Billing(hub).up, 60, 0.2, "the billing service")
    return hub


def storage(hub: Hub, name: str, token: str | None = None, **params) -> requests.Response:
    return hub.api("GET", f"/users/{name}/storage", token=token, params=params)


def set_quota(hub: Hub, name: str, body, token: str | None = None) -> requests.Response:
    data = body if isinstance(body, str) else json.dumps(body)
    headers = {"Content-Type": "application/json"}
    return hub.api("POST", f"/users/{name}/storage", token=token, data=data, headers=headers)


def quota(hub: Hub, name: str) -> int:
    r = storage(hub, name)
    assert r.status_code == 200, r.text
    return r.json()["home"]["quota_bytes"]


def balance(hub: Hub, name: str) -> Decimal:
    return Decimal(Billing(hub).balance(name)["balance"]["exact"])


def write_mib(hub: Hub, name: str, relative: str, mib: int) -> None:
    """``mib`` MiB of real (not sparse) data written by the user's own code in their server."""
    code = (
        "import os\n"
        f"with open({relative!r}, 'wb') as f:\n"
        f"    for _ in range({mib}):\n"
        "        f.write(os.urandom(1 << 20))\n"
        "    f.flush(); os.fsync(f.fileno())\n"
        "print('ok')"
    )
    with hub.kernel(name) as k:
        assert k.execute(code, timeout=120).strip().endswith("ok")


def remove(hub: Hub, name: str, relative: str) -> None:
    with hub.kernel(name) as k:
        k.execute(f"import os; os.remove({relative!r}); os.sync()")


def used_at_least(hub: Hub, name: str, nbytes: int) -> dict:
    """The user's storage answer once the hub's figure holds ``nbytes`` (figures are cached)."""

    def measured():
        r = storage(hub, name)
        return r.json() if r.ok and r.json()["home"]["used_bytes"] >= nbytes else None

    return wait_for(measured, 30, 0.5, f"{name}'s home to be measured at {nbytes} bytes")


def test_a_user_sees_their_own_storage_and_nobody_elses(shub: Hub) -> None:
    hub = shub
    alice, bob = hub.create_user(), hub.create_user()
    alice_token, bob_token = token_for(hub, alice), token_for(hub, bob)

    r = storage(hub, alice, alice_token)
    assert r.status_code == 200, r.text
    me = r.json()
    assert me["user"] == alice
    assert (me["free_gb"], me["max_gb"], me["price_per_gb_day"]) == (FREE_GB, MAX_GB, PRICE)
    assert me["currency"] == "CNY" and me["backend"] in ("image", "directory")
    assert me["enforced"] is (me["backend"] == "image")
    home = me["home"]
    assert home["quota_bytes"] == int(Decimal(FREE_GB) * GiB) and home["used_bytes"] >= 0
    assert home["measured_at"] > 0
    assert me["datasets_bytes"] == 0 and me["notice"] is None
    assert me["cost"]["per_day"] == "0.0000"  # the free size costs nothing
    assert "release" in me

    # Another user, their token, and nobody at all: refused (404 like JupyterHub's users API:
    # the scope is held for oneself only); the home's quota is not theirs to change.
    for method, body in (("GET", None), ("POST", {"quota_gb": 1})):
        r = hub.api(method, f"/users/{alice}/storage", token=bob_token, json=body)
        assert r.status_code == 404, (method, r.status_code, r.text)
    r = requests.get(f"{hub.url}/hub/api/users/{alice}/storage", timeout=30)
    assert r.status_code == 403
    assert hub.api("GET", "/storage", token=alice_token).status_code == 403
    assert quota(hub, alice) == home["quota_bytes"]
    # An admin sees anyone's.
    assert storage(hub, alice).json()["user"] == alice

    # Code in alice's own server holds its server's token: it reads her figure (JupyterLab's
    # status bar) but not bob's, cannot list every home, and cannot raise her quota (that costs
    # money: her log-in or her own tokens only).
    hub.spawn_ready(alice, {"gpu": "none"}, timeout=120)
    try:
        probe = (
            "import json, os, urllib.request, urllib.error\n"
            "api = os.environ['JUPYTERHUB_API_URL']\n"
            "hdr = {'Authorization': 'token ' + os.environ['JUPYTERHUB_API_TOKEN'],\n"
            "       'Content-Type': 'application/json'}\n"
            "def call(method, path, body=None):\n"
            "    data = None if body is None else json.dumps(body).encode()\n"
            "    req = urllib.request.Request(api + path, data=data, headers=hdr, method=method)\n"
            "    try:\n"
            "        return urllib.request.urlopen(req, timeout=30).status\n"
            "    except urllib.error.HTTPError as e:\n"
            "        return e.code\n"
            f"print(call('GET', '/users/{alice}/storage'), call('GET', '/users/{bob}/storage'),\n"
            f"      call('POST', '/users/{alice}/storage', {{'quota_gb': 1}}),\n"
            "      call('GET', '/storage'))\n"
        )
        with hub.kernel(alice) as k:
            own, other, raise_, listing = k.execute(probe).split()
        assert (own, other, raise_, listing) == ("200", "404", "403", "403")
        assert quota(hub, alice) == home["quota_bytes"]
    finally:
        hub.stop_server(alice)


def test_admin_lists_the_largest_homes_first(shub: Hub) -> None:
    hub = shub
    big, small = hub.create_user(), hub.create_user()
    for name, mib in ((small, 2), (big, 9)):
        hub.spawn_ready(name, {"gpu": "none"}, timeout=120)
        try:
            write_mib(hub, name, "data.bin", mib)
        finally:
            hub.stop_server(name)

    def listed():
        r = hub.api("GET", "/storage")
        assert r.status_code == 200, r.text
        rows = {h["user"]: h for h in r.json()["homes"] if h["user"]}
        fresh = rows.get(big, {}).get("used_bytes", 0) >= 9 * MiB
        return r.json() if fresh and rows.get(small, {}).get("used_bytes", 0) >= 2 * MiB else None

    answer = wait_for(listed, 30, 0.5, "the list to show both homes")
    used = [h["used_bytes"] for h in answer["homes"]]
    assert used == sorted(used, reverse=True)  # largest first
    order = [h["user"] for h in answer["homes"]]
    assert order.index(big) < order.index(small)
    row = next(h for h in answer["homes"] if h["user"] == big)
    assert row["quota_bytes"] == int(Decimal(FREE_GB) * GiB) and row["datasets_bytes"] == 0
    assert {"files", "enforced", "measured_at", "percent"} <= set(row)
    assert answer["free_gb"] == FREE_GB and answer["measured_at"] > 0

    # The page is the admin's; a user is refused, both the page and the list.
    admin = admin_web(hub)
    page = admin.get("/hub/gpulab/storage")
    assert page.status_code == 200 and "gpulab-storage-homes" in page.text
    home_page = admin.get("/hub/home")
    assert 'id="gpulab-nav-storage"' in home_page.text
    assert hub.api("GET", "/storage", token=token_for(hub, small)).status_code == 403
    person = WebSession(hub)
    assert person.login(approved_user(hub, "stor"), PASSWORD)
    r = person.get("/hub/gpulab/storage")
    assert r.status_code == 403 and "gpulab-storage-homes" not in r.text
    assert 'id="gpulab-nav-storage"' not in person.get("/hub/home").text


def test_bad_quota_requests_name_quota_gb_and_change_nothing(shub: Hub) -> None:
    hub = shub
    name = hub.create_user()
    token = token_for(hub, name)
    before_quota, before_balance = quota(hub, name), balance(hub, name)
    bad = [
        '{"quota_gb": "1"}',
        '{"quota_gb": "abc"}',
        '{"quota_gb": true}',
        '{"quota_gb": null}',
        '{"quota_gb": [1]}',
        '{"quota_gb": NaN}',
        '{"quota_gb": Infinity}',
        '{"quota_gb": 1e999}',
        '{"quota_gb": 0}',
        '{"quota_gb": -1}',
        '{"quota_gb": 0.1234567}',
        '{"quota_gb": 0.03}',  # below the free size
        '{"quota_gb": 4.5}',  # beyond the operator's limit
        "{}",
    ]
    for body in bad:
        r = set_quota(hub, name, body, token)
        assert r.status_code == 400, (body, r.status_code, r.text)
        assert r.json().get("field") == "quota_gb" and "quota_gb" in r.json()["message"], body
    r = set_quota(hub, name, {"quota_gb": 1, "size": 2}, token)
    assert r.status_code == 400 and r.json()["field"] == "size", r.text
    r = set_quota(hub, name, "[1]", token)
    assert r.status_code == 400, r.text
    # The price asked on a GET: the same check, and no change.
    for asked in ("lots", "4.5", "0.03"):  # not a number; beyond the limit; below the free size
        r = storage(hub, name, token, quota_gb=asked)
        assert r.status_code == 400 and r.json()["field"] == "quota_gb", (asked, r.text)
    # A cookie caller (a page) needs JupyterHub's XSRF token: a form elsewhere cannot post.
    admin = admin_web(hub)
    r = admin.http.post(f"{hub.url}/hub/api/users/{name}/storage", json={"quota_gb": 1}, timeout=30)
    assert r.status_code == 403, r.text
    assert quota(hub, name) == before_quota
    assert balance(hub, name) == before_balance


def test_quota_above_the_balance_is_402_and_a_get_changes_nothing(shub: Hub) -> None:
    hub = shub
    name = hub.create_user()
    token = token_for(hub, name)
    start = balance(hub, name)
    assert start == Decimal(TRIAL)
    free = quota(hub, name)

    # The price of a size, asked on a GET (what the home page's confirm step shows).
    for _ in range(3):
        r = storage(hub, name, token, quota_gb="1")
        assert r.status_code == 200, r.text
        assert r.json()["quote"]["per_day"] == "1.8750"  # (1 - 0.0625) GB x 2.00
    assert quota(hub, name) == free and balance(hub, name) == start

    # 1 GB costs 1.875 a day: the trial credit (1.00) cannot pay a day of it.
    r = set_quota(hub, name, {"quota_gb": 1}, token)
    assert r.status_code == 402, r.text
    assert r.json()["field"] == "quota_gb" and "balance" in r.json()["message"]
    assert "1.00" in r.json()["human"] and "1.88" in r.json()["human"]
    assert quota(hub, name) == free and balance(hub, name) == start

    # Half a GB costs 0.875 a day: it can.
    r = set_quota(hub, name, {"quota_gb": 0.5}, token)
    assert r.status_code == 200, r.text
    assert r.json()["home"]["quota_bytes"] == GiB // 2 == quota(hub, name)
    assert r.json()["cost"]["per_day"] == "0.8750"
    # Lowering it back is never refused for money.
    r = set_quota(hub, name, {"quota_gb": 0.0625}, token)
    assert r.status_code == 200 and r.json()["home"]["quota_bytes"] == free, r.text


def test_a_quota_below_what_the_home_holds_is_409(shub: Hub) -> None:
    hub = shub
    name = hub.create_user()
    token = token_for(hub, name)
    Billing(hub).credit(name, "5.00")
    r = set_quota(hub, name, {"quota_gb": 0.25}, token)
    assert r.status_code == 200, r.text
    hub.spawn_ready(name, {"gpu": "none"}, timeout=120)
    try:
        write_mib(hub, name, "big.bin", 80)  # more than the free 64 MiB
        r = set_quota(hub, name, {"quota_gb": 0.0625}, token)
        assert r.status_code == 409, r.text
        assert r.json()["field"] == "quota_gb" and "delete files" in r.json()["message"]
        assert quota(hub, name) == GiB // 4
        # The figure said when it was measured; a refresh within the cache reuses it.
        first = storage(hub, name, token).json()["home"]
        assert first["used_bytes"] >= 80 * MiB
        again = storage(hub, name, token).json()["home"]
        assert again["measured_at"] == first["measured_at"]
        remove(hub, name, "big.bin")
    finally:
        hub.stop_server(name)

    # Measured afresh (not the cached figure): now it fits. An image-backed home is resized with
    # no server holding it: a just-stopped one may hold it a moment longer (409, "in use").
    def lowered():
        r = set_quota(hub, name, {"quota_gb": 0.0625}, token)
        assert r.status_code == 200 or "in use" in r.text, r.text
        return r if r.status_code == 200 else None

    r = wait_for(lowered, 30, 0.5, "the quota to be lowered once the home is free")
    assert r.json()["home"]["used_bytes"] < 64 * MiB
