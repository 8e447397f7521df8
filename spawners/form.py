"""The spawn form: GPU types with live free/total, price, spot price and VRAM; images; datasets;
pricing (spot: max price, queue when it can't start, low-price windows only).

The form reads the same pool snapshot as ``GET /hub/api/gpulab/pool`` and refreshes the free
counts from it every few seconds, so what it shows is what the allocator will hand out.
"""

from __future__ import annotations

from html import escape
from typing import Any

from gpulab.spawners.market_hub import SpotMarket
from gpulab.spawners.options import DEFAULTS

FORM_CSS = """
<style>
.gpulab-form fieldset { border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; margin: 10px 0; }
.gpulab-form legend { font-weight: 600; padding: 0 6px; }
.gpulab-form .choice { display: flex; align-items: baseline; gap: 8px; padding: 3px 0; }
.gpulab-form .choice.full { color: #999; }
.gpulab-form .meta { color: #666; font-size: 90%; }
.gpulab-form .sim { background: #fff3cd; border-radius: 3px; padding: 0 4px; font-size: 85%; }
.gpulab-form .free { font-variant-numeric: tabular-nums; }
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
  setInterval(refresh, 5000);
  setInterval(refreshSpot, 10000);
  var pricing = document.querySelectorAll('input[name="pricing"]');
  function togglePrice() {
    var spot = document.querySelector('input[name="pricing"]:checked');
    document.getElementById("gpulab-max-price").disabled = !(spot && spot.value === "spot");
  }
  pricing.forEach(function (el) { el.addEventListener("change", togglePrice); });
  togglePrice();
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
    last = {**DEFAULTS, **(spawner.user_options or {})}
    cur = catalog.currency
    parts = [FORM_CSS, '<div class="gpulab-form">']

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
        f"<strong>{escape(no_gpu.display_name)} ({cur} {no_gpu.price_per_hour}/h)</strong>: "
        f"{escape(no_gpu.description)}</label>"
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
