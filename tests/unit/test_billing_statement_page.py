"""The statement page as a page of the hub, its chart of spend per day, and apps by name.

The spend per day is checked on the store (real SQLite and a real PostgreSQL, through ``ingest``
and ``statements.usage`` as the handlers call them): a span crossing midnight is split by its
seconds, each second at its own price, and the days add up to the statement's total to the
micro-unit. The page is checked on a real hub, which starts the real billing service and serves
the stylesheet and logo the page links: its navigation bar, its chart against the usage API's
``daily``, app names, and that one user cannot read another's statement.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path

import pytest
import requests
from billing.client import Billing, user_token
from billing.fixtures import (  # noqa: F401 (fixtures)
    billing_engine,
    billing_sqlite_engine,
    pg_cluster,
    pg_url,
)
from billing.scenario import app, heartbeat, kernel, server_start, server_stop
from harness import wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulab.billing_service import statements
from gpulab.billing_service.metering import ingest
from gpulab.billing_service.models import MICRO
from gpulab.billing_service.rating import US_PER_HOUR, PriceBook
from gpulab.billing_service.schemas import parse_batch
from gpulab.catalog import load_catalog
from gpulab.catalog.price_history import PRICES_FILE, PriceHistory, market_dir

CATALOG = load_catalog()
PRICES = PriceBook(CATALOG)
TRIAL = 10 * MICRO
# Midnight (UTC) between 2026-03-09 and 2026-03-10: the spans below cross it.
MIDNIGHT = datetime(2026, 3, 10, tzinfo=UTC).timestamp()
A100_MICRO_PER_HOUR = 2_100_000  # the catalog's a100-80g on-demand price, 2.10 per card-hour


def us(t: float) -> int:
    return round(t * MICRO)


def user_name() -> str:
    return f"u{uuid.uuid4().hex[:8]}"


def feed(engine, events: list[dict], prices: PriceBook = PRICES) -> None:
    """Events as the hub and admins post them (trusted: no reporter bounds)."""
    now = time.time_ns() // 1000
    result = ingest(engine, parse_batch({"events": events}, time.time()), prices, TRIAL, now)
    assert not result.rejected


def usage(engine, user: str, start: str, end: str, prices: PriceBook = PRICES) -> dict:
    lo = datetime.fromisoformat(start).replace(tzinfo=UTC).timestamp()
    hi = datetime.fromisoformat(end).replace(tzinfo=UTC).timestamp()
    with engine.connect() as conn:
        return statements.usage(conn, prices, user, us(lo), us(hi))


def assert_days_add_up(u: dict) -> None:
    """The days' amounts add up to the total exactly, none is negative, and their seconds to
    the billed seconds."""
    total = u["total"]["amount"]
    assert sum(Decimal(d["amount"]) for d in u["daily"]) == Decimal(total["exact"])
    assert sum(d["micro"] for d in u["daily"]) == total["micro"]
    assert all(d["micro"] >= 0 and Decimal(d["amount"]) * MICRO == d["micro"] for d in u["daily"])
    assert sum(us(d["seconds"]) for d in u["daily"]) == us(u["total"]["billed_seconds"])


# ---- spend per day, on the store ------------------------------------------------------------


def test_a_span_across_midnight_is_split_by_its_seconds_and_adds_up_exactly(engine) -> None:
    user = user_name()
    # A kernel from 10 s before midnight to 20 s after: 30 s of an A100 at 2.10/h = 0.0175
    # exactly, but 10 s = 5833.33… and 20 s = 11666.66… micro-units: the first day is rounded
    # down, the last day takes the rest.
    feed(
        engine,
        [
            server_start(user, MIDNIGHT - 60),
            kernel("kernel_start", user, "k-1", MIDNIGHT - 10),
            kernel("kernel_stop", user, "k-1", MIDNIGHT + 20),
            server_stop(user, MIDNIGHT + 60),
        ],
    )
    u = usage(engine, user, "2026-03-09", "2026-03-11")
    assert u["time_zone"] == "UTC"
    assert u["total"]["amount"]["exact"] == "0.0175"
    assert u["daily"] == [
        {"date": "2026-03-09", "amount": "0.005833", "micro": 5833, "seconds": 10.0},
        {"date": "2026-03-10", "amount": "0.011667", "micro": 11667, "seconds": 20.0},
    ]
    assert_days_add_up(u)
    # The older per-day list (billed seconds, charges by the day they were posted) agrees on
    # the seconds: both come from the same split.
    assert {d["day"]: d["billed_seconds"] for d in u["days"]} == {
        "2026-03-09": 10.0,
        "2026-03-10": 20.0,
    }


def test_each_day_of_the_period_is_listed_and_a_session_over_its_edge_counts_whole(
    engine,
) -> None:
    user = user_name()
    # A session from 23:30 on the 9th to 00:30 on the 10th, and one on the 12th; the statement
    # asks for the 10th to the 13th (exclusive): the 9th is listed all the same, because the
    # statement counts the first session whole.
    feed(
        engine,
        [
            server_start(user, MIDNIGHT - 1800),
            kernel("kernel_start", user, "k-1", MIDNIGHT - 1800),
            kernel("kernel_stop", user, "k-1", MIDNIGHT + 1800),
            server_stop(user, MIDNIGHT + 1800),
            server_start(user, MIDNIGHT + 2 * 86_400 + 3600),
            kernel("kernel_start", user, "k-2", MIDNIGHT + 2 * 86_400 + 3600),
            kernel("kernel_stop", user, "k-2", MIDNIGHT + 2 * 86_400 + 7200),
            server_stop(user, MIDNIGHT + 2 * 86_400 + 7200),
        ],
    )
    u = usage(engine, user, "2026-03-10", "2026-03-13")
    assert [(d["date"], d["amount"], d["seconds"]) for d in u["daily"]] == [
        ("2026-03-09", "1.05", 1800.0),
        ("2026-03-10", "1.05", 1800.0),
        ("2026-03-11", "0", 0.0),
        ("2026-03-12", "2.1", 3600.0),
    ]
    assert u["total"]["amount"]["exact"] == "4.2"
    assert_days_add_up(u)
    # A statement "since 2000" lists the days from the first to the last billed one, not 26
    # years of empty days.
    u = usage(engine, user, "2000-01-01", "2026-12-01")
    assert [d["date"] for d in u["daily"]] == [
        "2026-03-09",
        "2026-03-10",
        "2026-03-11",
        "2026-03-12",
    ]
    # A period with nothing billed: its days, each empty.
    u = usage(engine, user, "2026-04-01", "2026-04-04")
    assert [(d["date"], d["micro"]) for d in u["daily"]] == [
        ("2026-04-01", 0),
        ("2026-04-02", 0),
        ("2026-04-03", 0),
    ]


def test_spot_days_are_rated_at_the_price_each_second_had(engine, tmp_path: Path) -> None:
    """The days share the rated charge, not the seconds: a spot price that changes at midnight
    makes the two halves of an hour cost different amounts."""
    hist = PriceHistory(market_dir(tmp_path) / PRICES_FILE)
    assert hist.record("a100-80g", MIDNIGHT - 86_400, Decimal("0.40"))
    assert hist.record("a100-80g", MIDNIGHT, Decimal("0.60"))
    prices = PriceBook(CATALOG, tmp_path)
    user = user_name()
    start = server_start(user, MIDNIGHT - 1800)
    start["pricing"] = "spot"
    feed(
        engine,
        [
            start,
            kernel("kernel_start", user, "k-1", MIDNIGHT - 1800),
            kernel("kernel_stop", user, "k-1", MIDNIGHT + 1800),
            server_stop(user, MIDNIGHT + 1800),
        ],
        prices,
    )
    u = usage(engine, user, "2026-03-09", "2026-03-11", prices)
    assert [(d["date"], d["amount"]) for d in u["daily"]] == [
        ("2026-03-09", "0.2"),
        ("2026-03-10", "0.3"),
    ]
    assert u["total"]["amount"]["exact"] == "0.5"
    assert_days_add_up(u)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    gpu=st.sampled_from([("a100-80g", 1), ("rtx-4090", 2), ("none", 0)]),
    spans=st.lists(
        st.tuples(
            st.integers(0, 3 * 86_400 * 1000), st.integers(1, 2 * 86_400 * 1000)
        ),  # start, duration (ms)
        min_size=1,
        max_size=4,
    ),
)
def test_days_always_add_up_to_the_total(sqlite_engine, gpu, spans) -> None:
    user = user_name()
    t0 = MIDNIGHT - 86_400 + 0.123
    end = max(a + d for a, d in spans) / 1000
    events = [server_start(user, t0, gpu[0], gpu[1])]
    for i, (a, d) in enumerate(spans):
        events.append(kernel("kernel_start", user, f"k-{i}", t0 + a / 1000))
        events.append(kernel("kernel_stop", user, f"k-{i}", t0 + (a + d) / 1000))
    events.append(server_stop(user, t0 + end))
    feed(sqlite_engine, events)
    u = usage(sqlite_engine, user, "2026-03-09", "2026-03-15")
    assert_days_add_up(u)
    # Every day but the last is its exact share, rounded down: seconds x price, nothing moved.
    rate = PRICES.rate_micro_per_hour(gpu[0], gpu[1], "on-demand", 0)
    billed = [d for d in u["daily"] if d["seconds"]]
    for d in billed[:-1]:
        assert d["micro"] == rate * us(d["seconds"]) // US_PER_HOUR


# ---- apps by name, on the store --------------------------------------------------------------


def test_apps_are_named_in_the_statement_and_totalled_per_app(engine) -> None:
    user = user_name()
    t = MIDNIGHT - 100
    feed(
        engine,
        [
            server_start(user, t),
            app("app_start", user, "sd-webui-4242-1a2b3c4d", t + 10, name="sd-webui"),
            heartbeat(user, t + 20, [], apps=["sd-webui-4242-1a2b3c4d"]),
            app("app_stop", user, "sd-webui-4242-1a2b3c4d", t + 40, name="sd-webui"),
            app("app_start", user, "comfyui-77-5e6f7a8b", t + 30, name="comfyui"),
            app("app_stop", user, "comfyui-77-5e6f7a8b", t + 35, name="comfyui"),
            app("app_start", user, "sd-webui-4250-9c9c9c9c", t + 50, name="sd-webui"),
            app("app_stop", user, "sd-webui-4250-9c9c9c9c", t + 60, name="sd-webui"),
        ],
    )
    # A run first listed by a heartbeat alone (its app_start in a later batch) gets its name
    # all the same.
    feed(engine, [heartbeat(user, t + 70, [], apps=["jupyter-lsp-1-00000000"])])
    feed(engine, [app("app_stop", user, "jupyter-lsp-1-00000000", t + 80, name="lsp")])
    feed(engine, [server_stop(user, t + 90)])
    u = usage(engine, user, "2026-03-09", "2026-03-11")
    (server,) = u["servers"]
    assert sorted((a["app"], a["app_id"], a["app_seconds"]) for a in server["apps"]) == [
        ("comfyui", "comfyui-77-5e6f7a8b", 5.0),
        ("lsp", "jupyter-lsp-1-00000000", 10.0),
        ("sd-webui", "sd-webui-4242-1a2b3c4d", 30.0),
        ("sd-webui", "sd-webui-4250-9c9c9c9c", 10.0),
    ]
    assert u["apps"] == {"comfyui": 5.0, "lsp": 10.0, "sd-webui": 40.0}
    assert sum(u["apps"].values()) == u["total"]["app_seconds"]


# ---- the page, on a real hub ----------------------------------------------------------------


class Node:
    def __init__(self, tag: str, attrs: dict[str, str], parent: Node | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node] = []
        self.text = ""

    def all(self, tag: str | None = None, **attrs: str) -> list[Node]:
        """Descendants with this tag whose attributes hold these values (``class_`` is one of
        the classes)."""
        out = []
        for c in self.children:
            if (tag is None or c.tag == tag) and all(
                v in c.attrs.get("class", "").split() if k == "class_" else c.attrs.get(k) == v
                for k, v in attrs.items()
            ):
                out.append(c)
            out += c.all(tag, **attrs)
        return out

    def one(self, tag: str | None = None, **attrs: str) -> Node:
        (found,) = self.all(tag, **attrs)
        return found

    def ancestors(self) -> list[Node]:
        out, n = [], self.parent
        while n is not None:
            out.append(n)
            n = n.parent
        return out

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)


class Page(HTMLParser):
    """The page as a tree (stdlib parser; HTML's void elements have no end tag)."""

    VOID = {"meta", "link", "img", "input", "br", "hr"}

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root = self.node = Node("#document", {}, None)
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs}, self.node)
        self.node.children.append(node)
        if tag not in self.VOID:
            self.node = node

    def handle_startendtag(self, tag, attrs) -> None:
        self.node.children.append(Node(tag, {k: v or "" for k, v in attrs}, self.node))

    def handle_endtag(self, tag) -> None:
        n = self.node
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.node = n.parent

    def handle_data(self, data) -> None:
        self.node.text += data


@pytest.fixture(scope="module")
def shub(module_hub_factory):
    h = module_hub_factory("statement-hub")
    wait_for(Billing(h).up, 30, 0.2, "the billing service")
    return h


@pytest.fixture(scope="module")
def billing(shub) -> Billing:
    return Billing(shub)


@pytest.fixture(scope="module")
def alice_and_bob(shub, billing) -> tuple[str, str]:
    """Two users of the hub: bob ran a kernel and the SD WebUI across midnight, alice a kernel on
    the 10th. Their usage is posted as the hub posts its own (the admin's token: no bounds)."""
    alice, bob = shub.create_user(user_name()), shub.create_user(user_name())
    run = "sd-webui-4242-1a2b3c4d"
    events = [
        server_start(bob, MIDNIGHT - 3600),
        kernel("kernel_start", bob, "bob-k", MIDNIGHT - 1800),
        app("app_start", bob, run, MIDNIGHT - 600, name="sd-webui"),
        heartbeat(bob, MIDNIGHT + 600, ["bob-k"], apps=[run]),
        kernel("kernel_stop", bob, "bob-k", MIDNIGHT + 900),
        app("app_stop", bob, run, MIDNIGHT + 2700, name="sd-webui"),
        server_stop(bob, MIDNIGHT + 3600),
        server_start(alice, MIDNIGHT + 7200, "none"),
        kernel("kernel_start", alice, "alice-k", MIDNIGHT + 7200),
        kernel("kernel_stop", alice, "alice-k", MIDNIGHT + 10_800),
        server_stop(alice, MIDNIGHT + 10_800),
    ]
    r = billing.post("api/v1/events", {"events": events})
    assert r.status_code == 200 and r.json()["accepted"] == len(events), r.text
    return alice, bob


PERIOD = {"from": "2026-03-09", "to": "2026-03-11"}


def test_the_page_is_a_page_of_the_hub(shub, billing, alice_and_bob) -> None:
    alice, _ = alice_and_bob
    token = user_token(shub, alice)
    r = billing.get("", token, params=PERIOD)
    assert r.status_code == 200, r.text
    page = Page(r.text).root

    # The hub's own stylesheet and favicon, served by the hub (the proxy's origin, as the page
    # loads them); nothing from elsewhere.
    (css,) = [n.attrs["href"] for n in page.all("link", rel="stylesheet")]
    assert css == "/hub/static/css/style.min.css"
    got = requests.get(shub.url + css, timeout=30)
    assert got.status_code == 200 and got.headers["Content-Type"].startswith("text/css")
    assert "--bs-primary" in got.text  # Bootstrap 5, as JupyterHub 6 ships it
    links = [n.attrs.get("href") or n.attrs.get("src") for n in page.all()]
    assert all(not u.startswith(("http:", "https:", "//")) for u in links if u), links

    # The hub's navigation bar: its logo linking home, Home and Token, the user and Logout.
    nav = page.one("nav", class_="navbar")
    logo = nav.one("img", class_="jpy-logo")
    assert logo.attrs["src"] == "/hub/logo" and logo.parent.attrs["href"] == "/hub/home"
    assert requests.get(shub.url + logo.attrs["src"], timeout=30).status_code == 200
    left = {a.all_text().strip(): a.attrs["href"] for a in nav.all("a", class_="nav-link")}
    assert left["Home"] == "/hub/home" and left["Token"] == "/hub/token"
    widget = nav.one("span", id="login_widget")
    assert alice in widget.all_text()
    assert widget.one("a", id="logout").attrs["href"] == "/hub/logout"
    assert "Logout" in widget.one("a", id="logout").all_text()
    # Bootstrap's layout: a container of cards, tables styled as the hub's.
    container = page.one("div", id="statement")
    assert "container" in container.classes and container.all("div", class_="card")
    assert "table" in page.one("table", id="servers").classes


def test_the_chart_has_a_bar_per_day_with_the_apis_amounts(shub, billing, alice_and_bob) -> None:
    _, bob = alice_and_bob
    token = user_token(shub, bob)
    api = billing.get(f"api/v1/users/{bob}/usage", token, params=PERIOD).json()
    daily = api["daily"]
    assert [d["date"] for d in daily] == ["2026-03-09", "2026-03-10"]
    # Billed: the union of the kernel (-30 min to +15 min) and the app (-10 min to +45 min).
    assert [d["seconds"] for d in daily] == [1800.0, 2700.0]
    assert sum(Decimal(d["amount"]) for d in daily) == Decimal(api["total"]["amount"]["exact"])

    page = Page(billing.get("", token, params=PERIOD).text).root
    svg = page.one("svg", id="spend-chart")
    bars = svg.all("rect", class_="bar")
    assert [(b.attrs["data-date"], b.attrs["data-amount"]) for b in bars] == [
        (d["date"], d["amount"]) for d in daily
    ]
    # Accessible: the picture is named and described, each day says its numbers on hover, and
    # the same numbers are a table.
    assert svg.attrs["role"] == "img"
    title_id, desc_id = svg.attrs["aria-labelledby"].split()
    assert "Spend per day (UTC), CNY" in svg.one("title", id=title_id).all_text()
    assert "CNY" in svg.one("desc", id=desc_id).all_text()
    days = svg.all("g", class_="day")
    assert [g.children[0].tag for g in days] == ["title"] * len(daily)
    assert days[0].children[0].all_text().startswith("2026-03-09 (UTC): CNY ")
    rows = page.one("table", id="daily").one("tbody").all("tr")
    cells = [r.all("td") for r in rows]
    assert [c[0].all_text() for c in cells] == [d["date"] for d in daily]
    assert [c[2].attrs["title"] for c in cells] == [f"exact: {d['amount']}" for d in daily]
    # Taller bar, larger amount.
    heights = [float(b.attrs["height"]) for b in bars]
    assert (heights[0] < heights[1]) == (daily[0]["micro"] < daily[1]["micro"])
    assert page.one("span", id="time-zone").all_text() == "UTC"


def test_apps_appear_by_name_in_the_api_and_on_the_page(shub, billing, alice_and_bob) -> None:
    _, bob = alice_and_bob
    token = user_token(shub, bob)
    api = billing.get(f"api/v1/users/{bob}/usage", token, params=PERIOD).json()
    (server,) = api["servers"]
    (run,) = server["apps"]
    assert (run["app"], run["app_id"], run["app_seconds"]) == (
        "sd-webui",
        "sd-webui-4242-1a2b3c4d",
        3300.0,
    )
    assert api["apps"] == {"sd-webui": 3300.0}
    page = Page(billing.get("", token, params=PERIOD).text).root
    row = page.one("table", id="servers").one("tr", class_="app")
    assert row.attrs["data-app"] == "sd-webui"
    assert "App: sd-webui" in row.all_text()
    assert "App: sd-webui" in page.one("table", id="apps").all_text()


def test_a_user_cannot_read_another_users_statement(shub, billing, alice_and_bob) -> None:
    alice, bob = alice_and_bob
    token = user_token(shub, alice)
    bobs = billing.get(f"api/v1/users/{bob}/usage", user_token(shub, bob), params=PERIOD).json()
    secrets = [bobs["total"]["amount"]["exact"], "sd-webui", "bob-k"]
    attempts = [
        billing.get("", token, params={**PERIOD, "user": bob}),
        # The last of repeated parameters is the one read, and the one checked.
        billing.get(f"?user={alice}&user={bob}", token),
        billing.get("statement.csv", token, params={"user": bob}),
        billing.get(f"api/v1/users/{bob}/usage", token, params=PERIOD),
        billing.get(f"api/v1/users/{bob}/balance", token),
        billing.get(f"api/v1/users/{bob}/credits", token),
    ]
    for r in attempts:
        assert r.status_code == 403, (r.url, r.status_code, r.text[:300])
        assert not any(s in r.text for s in secrets), (r.url, r.text[:300])
    # Without any token, nothing either (the page sends the browser to log in at the hub).
    r = requests.get(billing.base, params={"user": bob}, allow_redirects=False, timeout=30)
    assert r.status_code in (302, 403) and not any(s in r.text for s in secrets)
    # Her own statement shows her usage only.
    own = billing.get("", token, params=PERIOD)
    assert own.status_code == 200 and not any(s in own.text for s in secrets[1:])
