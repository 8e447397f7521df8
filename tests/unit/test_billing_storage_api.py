"""Billing's storage routes on the real app and handlers (in-process, fresh SQLite; the hub's
token check replaced by fixed token models): who may read a user's storage charges and make
billing read the hub's scan, and that no route takes storage figures from a user or a server
(issue 23: billing meters GB-days from what the hub measures, not what the user reports)."""

from __future__ import annotations

from decimal import Decimal

from billing.service import make_service, serve

from gpulab.billing_service import ledger, storage
from gpulab.billing_service.hub_client import HubClient
from gpulab.billing_service.models import MICRO

ALICE = {"kind": "user", "name": "alice", "scopes": ["self"]}
# Alice's server's own token: what any code in her server can read.
ALICE_SERVER = {
    "kind": "user",
    "name": "alice",
    "scopes": ["custom:gpulab:report-usage!server=alice/", "read:users:name!user=alice"],
}
ADMIN = {"kind": "user", "name": "admin", "scopes": ["admin:users"]}
TOKENS = {
    "alice": ALICE,
    "alice-server": ALICE_SERVER,
    "bob": {**ALICE, "name": "bob"},
    "admin": ADMIN,
}
T0 = 1_767_225_600 * MICRO  # 2026-01-01 00:00 UTC


def service_with_storage(tmp_path, monkeypatch):
    service = make_service(tmp_path, monkeypatch, TOKENS)
    service.storage_metering = storage.StorageMetering(service)
    # A hub nobody answers at: a pull the admin asks for gets no scan (502), and figures can
    # come from nowhere else.
    service.hub = HubClient("http://127.0.0.1:9/hub/api", "unused")
    st = service.catalog.storage
    with service.engine.begin() as conn:
        for t in (T0, T0 + 6 * 3600 * MICRO):
            m = storage.Measurement("alice", t, 0, st.free_bytes + 2**30, 0)
            storage.record(conn, st, m, t + 1, service.trial_micro)
    return service


def test_a_user_reads_their_own_storage_charges_only(tmp_path, monkeypatch) -> None:
    service = service_with_storage(tmp_path, monkeypatch)
    price = Decimal(service.catalog.storage.price_per_gb_day)

    async def scenario(c):
        code, body = await c.call(
            "GET", "users/alice/storage?from=2025-12-01&to=2026-02-01", "alice"
        )
        assert code == 200, body
        (day,) = body["days"]
        assert day["date"] == "2026-01-01" and Decimal(day["gb_days"]) == Decimal("0.25")
        assert Decimal(day["amount"]["exact"]) == (price / 4).quantize(Decimal("0.000001"))
        (piece,) = body["pieces"]
        assert piece["billable_bytes"] == 2**30 and piece["to"] - piece["from"] == 6 * 3600
        assert body["home"]["billable_bytes"] == 2**30
        for token in ("bob", "alice-server"):  # another user; alice's server asking for admin's
            code, body = await c.call("GET", "users/admin/storage", token)
            assert code == 403, (token, body)
        code, _ = await c.call("GET", "users/alice/storage", "bob")
        assert code == 403
        code, _ = await c.call("GET", "users/alice/storage", "admin")
        assert code == 200

    serve(service, scenario)


def test_no_user_or_server_token_can_post_storage_figures(tmp_path, monkeypatch) -> None:
    """Nothing changes the charge but the hub's own scan: a user's or a server's token cannot
    post figures anywhere, nor make billing pull; the figures they send are not read."""
    service = service_with_storage(tmp_path, monkeypatch)

    def balance() -> int:
        with service.engine.connect() as conn:
            return ledger.balance(conn, ledger.user("alice"))

    before = balance()
    forged = {"used_bytes": 0, "quota_bytes": 0, "datasets_bytes": 0, "measured_at": 1e10}

    async def scenario(c):
        for token in ("alice", "alice-server"):
            code, body = await c.call("POST", "storage/pull", token, {"homes": [forged]})
            assert code == 403 and "admin:users" in body["message"], body
            code, _ = await c.call("POST", "users/alice/storage", token, forged)
            assert code == 405
            code, _ = await c.call("PUT", "users/alice/storage", token, forged)
            assert code == 405
            event = {"id": f"x-{token}", "kind": "storage", "user": "alice", "server": "", "t": 1}
            code, body = await c.call("POST", "events", token, {"events": [{**event, **forged}]})
            assert code == 400 and body["field"].endswith("kind"), body
        # An admin's nudge reads the hub (unreachable here): still nothing from the body.
        code, body = await c.call("POST", "storage/pull", "admin", {"homes": [forged]})
        assert code == 502, body

    serve(service, scenario)
    assert balance() == before
