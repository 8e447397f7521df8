"""The spawn form: GPU types with live free/total, price, spot price and VRAM; images; datasets;
pricing (spot: max price, queue when it can't start, low-price windows only); and, while this
server has a queued request, that request: its condition, place in the queue, the current spot
price (refreshed) and a Cancel button (``DELETE /hub/api/gpulab/spot/queue/USER``).

The form reads the same pool snapshot as ``GET /hub/api/gpulab/pool`` and refreshes the free
counts from it every few seconds, so what it shows is what the allocator will hand out.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.options import DEFAULTS

FORM_CSS = """
<style>
.gpulab-form fieldset { border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; margin: 10px 0; }
.gpulab-form legend { font-weight: 600; font-size: 1.15rem; padding: 0 6px; width: auto; }
.gpulab-form .choice { display: flex; align-items: baseline; gap: 8px; padding: 3px 0; }
.gpulab-form .choice.full { color: #999; }
.gpulab-form .meta { color: #666; font-size: 90%; }
.gpulab-form .sim { background: #fff3cd; border-radius: 3px; padding: 0 4px; font-size: 85%; }
.gpulab-form .free { font-variant-numeric: tabular-nums; white-space: nowrap; }
.gpulab-form .choice strong { white-space: nowrap; }
.gpulab-form .gpulab-queued { border-color: #f0ad4e; background: #fffaf0; }
</style>
"""

FORM_JS = """
<script>
(function () {
  var base = (window.jhdata && window.jhdata.base_url) || "/hub/";
  var xsrf = (window.jhdata && window.jhdata.xsrf_token) || "";
  function refresh() {
    fetch(base + "api/gpulab/pool", {headers: {"X-XSRFToken": xsrf}, credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (pool) {
        if (!pool) return;
        pool.gpu_types.forEach(function (t) {
          var el = document.querySelector('[data-gpu-free="' + t.slug + '"]');
          if (el) el.textContent = t.free + "/" + t.total + " free";
          var row = document.querySelector('[data-gpu-row="' + t.slug + '"]');
          if (row) row.classList.toggle("full", t.free === 0);
        });
      }).catch(function () {});
  }
  function refreshSpot() {
    fetch(base + "api/gpulab/spot/prices?hours=1", {headers: {"X-XSRFToken": xsrf}, credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (prices) {
        if (!prices) return;
        prices.gpu_types.forEach(function (t) {
          var el = document.querySelector('[data-gpu-spot="' + t.slug + '"]');
          if (el) el.textContent = t.price;
        });
      }).catch(function () {});
  }
  var queued = document.getElementById("gpulab-queued");
  function queueUrl() {
    var server = queued.dataset.server;
    return base + "api/gpulab/spot/queue/" + encodeURIComponent(queued.dataset.user) +
      (server ? "?server=" + encodeURIComponent(server) : "");
  }
  function queueSay(text) {
    document.getElementById("gpulab-queue-state").textContent = text;
  }
  function refreshQueue() {
    if (!queued || queued.dataset.done) return;
    fetch(base + "api/gpulab/spot/queue", {headers: {"X-XSRFToken": xsrf}, credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (answer) {
        if (!answer) return;
        var mine = answer.queue.filter(function (q) { return q.id === queued.dataset.id; })[0];
        if (!mine) {
          queued.dataset.done = "gone";
          queueSay("No longer queued: it has started (or was cancelled). Reload this page.");
          document.getElementById("gpulab-queue-cancel").disabled = true;
          return;
        }
        document.getElementById("gpulab-queue-position").textContent = mine.position;
        document.getElementById("gpulab-queue-length").textContent = mine.queue_length;
        document.getElementById("gpulab-queue-price").textContent = mine.current_price;
      }).catch(function () {});
  }
  if (queued) {
    document.getElementById("gpulab-queue-cancel").addEventListener("click", function () {
      this.disabled = true;
      fetch(queueUrl(), {method: "DELETE", headers: {"X-XSRFToken": xsrf}, credentials: "same-origin"})
        .then(function (r) {
          return r.json().then(function (body) { return {ok: r.ok, body: body}; });
        })
        .then(function (answer) {
          if (answer.ok) {
            queued.dataset.done = "cancelled";
            queueSay("Cancelled: request " + answer.body.cancelled + " left the queue. " +
              "Nothing is held or charged.");
          } else {
            document.getElementById("gpulab-queue-cancel").disabled = false;
            queueSay("Could not cancel: " + (answer.body.message || "error"));
          }
        }).catch(function (e) {
          document.getElementById("gpulab-queue-cancel").disabled = false;
          queueSay("Could not cancel: " + e);
        });
    });
  }
  setInterval(refresh, 5000);
  setInterval(refreshSpot, 10000);
  setInterval(refreshQueue, 5000);
  var pricing = document.querySelectorAll('input[name="pricing"]');
  function togglePrice() {
    var spot = document.querySelector('input[name="pricing"]:checked');
    document.getElementById("gpulab-max-price").disabled = !(spot && spot.value === "spot");
  }
  pricing.forEach(function (el) { el.addEventListener("change", togglePrice); });
  togglePrice();
  // Cards mean nothing in no-GPU mode (the hub ignores them there): grey the field out.
  function toggleCards() {
    var gpu = document.querySelector('input[name="gpu"]:checked');
    document.querySelector('input[name="gpus"]').disabled = !!(gpu && gpu.value === "none");
  }
  document.querySelectorAll('input[name="gpu"]').forEach(function (el) {
    el.addEventListener("change", toggleCards);
  });
  toggleCards();
})();
</script>
"""


def _checked(cond: bool) -> str:
    return " checked" if cond else ""


async def render_form(spawner: Any) -> str:
    pool = spawner.pool
    catalog = pool.catalog
    snap = await pool.snapshot()
    market = SpotMarket.instance(config=spawner.config)
    queued = market.queued_entry(spawner.owner)
    # A queued request never became a spawn, so user_options still hold the server before it:
    # the form shows the queued request's choices, else "Start" would quietly submit others.
    last = {
        **DEFAULTS,
        **(spawner.user_options or {}),
        **((queued or {}).get("options") or {}),
    }
    cur = catalog.currency
    parts = [FORM_CSS, '<div class="gpulab-form">']
    if queued is not None:
        parts.append(_queued_panel(queued, market, cur, spawner.user.name, spawner.name))

    parts.append("<fieldset><legend>GPU</legend>")
    for t in snap["gpu_types"]:
        if t["total"] == 0:
            continue
        slug = escape(t["slug"])
        sim = ' <span class="sim">simulated</span>' if t["simulated"] else ""
        full = " full" if t["free"] == 0 else ""
        parts.append(
            f'<label class="choice{full}" data-gpu-row="{slug}">'
            f'<input type="radio" name="gpu" value="{slug}"{_checked(last["gpu"] == t["slug"])}>'
            f"<strong>{escape(t['display_name'])}</strong>{sim}"
            f'<span class="meta">{t["vram_gb"]} GB VRAM &middot; {cur} {escape(t["on_demand_price"])}'
            f"/h per card &middot; spot from {escape(t['spot_floor_price'])}</span>"
            f'<span class="free" data-gpu-free="{slug}">{t["free"]}/{t["total"]} free</span>'
            f'<span class="meta">spot now {cur} <span data-gpu-spot="{slug}">'
            f"{market.current_price(t['slug'])}</span>/h</span>"
            "</label>"
        )
    no_gpu = catalog.no_gpu
    parts.append(
        '<label class="choice" data-gpu-row="none">'
        f'<input type="radio" name="gpu" value="none"{_checked(last["gpu"] == "none")}>'
        f"<strong>{escape(no_gpu.display_name)}</strong>"
        f'<span class="meta">{cur} {no_gpu.price_per_hour}/h &middot; '
        f"{escape(no_gpu.description)}</span></label>"
    )
    gpus = last["gpus"] if last["gpu"] != "none" else 1
    parts.append(
        '<label class="choice">Cards <input type="number" name="gpus" min="1" '
        f'max="{catalog.max_gpus_per_server}" value="{escape(str(gpus or 1))}"></label>'
    )
    parts.append("</fieldset>")

    # A spawner whose images may be missing on this node (Docker) says which are present; the
    # others (local processes) always run the hub's own environment.
    hook = getattr(spawner, "image_availability", None)
    available = await hook() if hook is not None else {}
    present = [s for s in catalog.images if s not in available or available[s].present]
    selected = last["image"] if last["image"] in present else (present[0] if present else "")
    parts.append('<fieldset><legend>Image</legend><select name="image" class="form-control">')
    for slug, image in catalog.images.items():
        status = available.get(slug)
        # The image's own labels say what it preloads; the catalog's list is the fallback.
        preloads = ", ".join(status.preloads if status and status.present else image.preloads)
        missing = status is not None and not status.present
        parts.append(
            f'<option value="{escape(slug)}"{" selected" if selected == slug else ""}'
            f"{' disabled' if missing else ''}>"
            f"{escape(image.display_name)}: {escape(image.description)}"
            f"{' (' + escape(preloads) + ')' if preloads else ''}"
            f"{' - unavailable: ' + escape(status.reason) if missing else ''}</option>"
        )
    parts.append("</select></fieldset>")

    if catalog.datasets:
        parts.append("<fieldset><legend>Datasets (mounted read-only at ~/datasets)</legend>")
        for slug, ds in catalog.datasets.items():
            parts.append(
                '<label class="choice">'
                f'<input type="checkbox" name="datasets" value="{escape(slug)}"'
                f"{_checked(slug in (last.get('datasets') or []))}>"
                f"<strong>{escape(ds.display_name)}</strong>"
                f'<span class="meta">{escape(ds.size)} &middot; {escape(ds.description)} &middot; '
                f"{escape(ds.license)}</span></label>"
            )
        parts.append("</fieldset>")

    parts.append(
        "<fieldset><legend>Pricing</legend>"
        '<label class="choice"><input type="radio" name="pricing" value="on-demand"'
        f"{_checked(last['pricing'] != 'spot')}> On demand, billed per second</label>"
        '<label class="choice"><input type="radio" name="pricing" value="spot"'
        f"{_checked(last['pricing'] == 'spot')}> Spot: cheaper idle GPUs, may be reclaimed "
        "after a warning</label>"
        f'<label class="choice">Max price ({cur}/card-hour) <input id="gpulab-max-price" '
        f'type="number" name="max_price" min="0.01" step="0.01" '
        f'value="{escape(str(last.get("max_price") or ""))}"></label>'
        '<label class="choice"><input type="checkbox" name="wait" value="true"'
        f"{_checked(bool(last.get('wait')))}> If it can't start now, queue it and start it when "
        "a card is free and the price is at most my max price</label>"
        '<label class="choice"><input type="checkbox" name="windows_only" value="true"'
        f"{_checked(bool(last.get('windows_only')))}> Run only in low-price windows "
        f"({escape(', '.join(market.low_price_windows))}"
        f"{', weekends' if market.weekends_low else ''})</label>"
        "</fieldset>"
    )
    parts.append("</div>")
    parts.append(FORM_JS)
    return "\n".join(parts)


def _queued_panel(q: dict[str, Any], market: SpotMarket, cur: str, user: str, server: str) -> str:
    """This server's queued request: what it waits for, its place, the price now, Cancel."""
    gpu = market.pool.catalog.gpu_types.get(q["gpu_type"])
    name = escape(gpu.display_name if gpu else q["gpu_type"])
    windows = ", ".join(market.low_price_windows) + (", weekends" if market.weekends_low else "")
    if q["pricing"] == "on-demand":
        what = f"{name} x{q['gpus']}, on demand"
        condition = "Starts by itself when a spot server of that type has been reclaimed for it."
    else:
        what = (
            f"{name} x{q['gpus']}, spot, max price {cur} {escape(q['max_price'] or '?')}/card-hour"
        )
        condition = (
            "Starts by itself when a card is free and the spot price is at most your max price"
            + (f", inside a low-price window ({escape(windows)})." if q["windows_only"] else ".")
        )
    queued_at = time.strftime("%H:%M:%S", time.localtime(q["queued_at"]))
    return (
        f'<fieldset class="gpulab-queued" id="gpulab-queued" data-id="{escape(q["id"])}" '
        f'data-user="{escape(user)}" data-server="{escape(server)}">'
        "<legend>Your queued request</legend>"
        f"<p>Queued as {escape(q['id'])} at {queued_at}: {what}.</p>"
        f"<p>{condition}</p>"
        '<p>Position <span id="gpulab-queue-position">'
        f'{q["position"]}</span> of <span id="gpulab-queue-length">{q["queue_length"]}</span> '
        f"in the {name} queue &middot; spot price now {cur} "
        f'<span id="gpulab-queue-price">{escape(q["current_price"])}</span>/card-hour</p>'
        '<p><button type="button" class="btn btn-danger" id="gpulab-queue-cancel">'
        'Cancel queued request</button> <span id="gpulab-queue-state"></span></p>'
        '<p class="meta">Starting a server with the form below replaces this request.</p>'
        "</fieldset>"
    )
