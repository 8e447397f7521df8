// The operator's console: GET /hub/api/gpulab/admin/console (the hub's snapshot, the same numbers
// as /hub/metrics) fills the cards, the utilisation chart, the queues, the preemptions and the
// slowest spawns; billing's GET .../api/admin/revenue?days=30 (asked with the admin's own session,
// billing checks it) fills the money. If billing does not answer, its section says so and the rest
// works. Charts are inline SVG drawn here (no chart library, nothing from another origin). Every
// name goes in with textContent only: user, server and course names are users'.
(function () {
  "use strict";
  const jh = window.jhdata;
  const $ = (id) => document.getElementById(id);
  const root = $("gpulab-console");
  const billingBase = root.dataset.billingUrl || "";
  const SVG = "http://www.w3.org/2000/svg";
  // One colour per GPU type, in the order the hub lists them (Bootstrap's palette).
  const COLOURS = ["#0d6efd", "#d63384", "#198754", "#fd7e14", "#6f42c1", "#20c997", "#dc3545"];

  const el = (tag, attrs, ...children) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role" || k === "title")
        node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  };
  const svg = (tag, attrs, ...children) => {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  };

  function when(t) {
    if (t === null || t === undefined) return "—";
    const d = new Date(Number(t) * 1000);
    return d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    const s = Math.max(0, Number(seconds));
    if (s < 10) return s.toFixed(1) + " s";
    if (s < 120) return Math.round(s) + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    if (s < 172800) return (s / 3600).toFixed(1) + " h";
    return Math.round(s / 86400) + " days";
  }

  function money(currency, amount) {
    if (amount === null || amount === undefined || amount === "") return "—";
    return currency + " " + amount;
  }

  function empty(table, text) {
    const cols = table.tHead.rows[0].cells.length;
    return el("tr", {}, el("td", { colSpan: cols, class: "text-body-secondary" }, text));
  }

  function fill(id, rows, none) {
    const table = $(id);
    table.tBodies[0].replaceChildren(...(rows.length ? rows : [empty(table, none)]));
  }

  // ---- the hub's part ----------------------------------------------------------------------

  function cardState(c, currency) {
    if (c.state !== "held") {
      const words = { free: "free", reserved: "reserved", offline: "offline" };
      return el("span", { class: "text-body-secondary" }, words[c.state] || c.state);
    }
    const util = c.util_pct === null || c.util_pct === undefined ? null : Math.round(c.util_pct);
    if (c.busy) {
      return el(
        "span",
        { class: "badge text-bg-success", "data-activity": "busy" },
        "busy" + (util === null ? "" : " " + util + " %"),
      );
    }
    const idle = c.idle_seconds === null || c.idle_seconds === undefined
      ? "idle"
      : "idle " + Math.floor(c.idle_seconds / 60) + " min";
    return el(
      "span",
      { class: "badge text-bg-warning", "data-activity": "idle" },
      idle + (util === null ? "" : " (" + util + " %)"),
    );
  }

  function renderCards(data) {
    const byNode = new Map();
    for (const c of data.cards) {
      if (!byNode.has(c.node)) byNode.set(c.node, []);
      byNode.get(c.node).push(c);
    }
    const blocks = [];
    for (const [node, cards] of byNode) {
      const rows = cards.map((c) =>
        el(
          "tr",
          { "data-uuid": c.uuid, "data-state": c.state },
          el(
            "td",
            {},
            el("span", { class: "fw-semibold" }, "#" + c.index + " " + (c.display_name || c.type)),
            c.simulated ? el("span", { class: "badge text-bg-secondary ms-1" }, "simulated") : null,
            el("div", { class: "small text-body-secondary font-monospace" }, c.uuid),
          ),
          el("td", { class: "gpulab-console-holder" }, c.user ? c.user + (c.server ? "/" + c.server : "") : "—"),
          el("td", {}, c.since ? when(c.since) : "—",
            c.since ? el("div", { class: "small text-body-secondary" }, duration(data.time - c.since)) : null),
          el("td", {}, c.pricing ? c.pricing.replace("_", "-") : "—"),
          el("td", { class: "text-end" }, c.price_per_hour ? money(data.currency, c.price_per_hour) + "/h" : "—"),
          el("td", {}, cardState(c, data.currency)),
        ),
      );
      const table = el(
        "table",
        { class: "table table-sm align-middle mb-3 gpulab-console-node", "data-node": node },
        el(
          "thead",
          {},
          el(
            "tr",
            {},
            el("th", { scope: "col" }, "Card"),
            el("th", { scope: "col" }, "Held by"),
            el("th", { scope: "col" }, "Since"),
            el("th", { scope: "col" }, "Pricing"),
            el("th", { scope: "col", class: "text-end" }, "Price"),
            el("th", { scope: "col" }, "Activity"),
          ),
        ),
        el("tbody", {}, ...rows),
      );
      const held = cards.filter((c) => c.state === "held").length;
      blocks.push(
        el("h3", { class: "h6 mt-2" }, "Node " + node + " · " + held + " of " + cards.length + " held"),
        table,
      );
    }
    if (!blocks.length) blocks.push(el("p", { class: "text-body-secondary" }, "No cards in the pool."));
    $("gpulab-console-nodes").replaceChildren(...blocks);
  }

  function renderSummary(data) {
    const n = (state) => data.cards.filter((c) => c.state === state).length;
    const held = data.cards.filter((c) => c.state === "held");
    const busy = held.filter((c) => c.busy).length;
    const simulated = data.cards.some((c) => c.simulated);
    $("gpulab-console-summary").replaceChildren(
      el(
        "span",
        {},
        data.cards.length + " cards: " + n("free") + " free, " + held.length + " held (" + busy +
          " busy, " + (held.length - busy) + " idle), " + n("reserved") + " reserved, " +
          n("offline") + " offline. " + data.queues.length + " waiting in queues.",
      ),
      simulated ? el("span", { class: "badge text-bg-secondary ms-2" }, "simulated pool") : null,
    );
  }

  function chart(series, opts) {
    // series: [{label, colour, points: [[t, value], ...]}]; x from opts.from to opts.to.
    const W = 760, H = 200, L = 44, R = 10, T = 10, B = 26;
    const x = (t) => L + ((t - opts.from) / (opts.to - opts.from)) * (W - L - R);
    const y = (v) => T + (1 - v / opts.max) * (H - T - B);
    const g = svg("svg", {
      viewBox: "0 0 " + W + " " + H,
      width: "100%",
      role: "img",
      "aria-label": opts.label,
      class: opts.cls,
    });
    for (const v of opts.ticks) {
      g.append(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#dee2e6" }));
      const t = svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#6c757d" });
      t.textContent = opts.tick(v);
      g.append(t);
    }
    for (const [t, label] of opts.xticks) {
      const tx = svg("text", { x: x(t), y: H - 8, "text-anchor": "middle", "font-size": 11, fill: "#6c757d" });
      tx.textContent = label;
      g.append(tx);
    }
    for (const s of series) {
      const pts = s.points.filter((p) => p[0] >= opts.from && p[0] <= opts.to);
      const line = svg("polyline", {
        points: pts.map((p) => x(p[0]).toFixed(1) + "," + y(Math.min(opts.max, p[1])).toFixed(1)).join(" "),
        fill: "none",
        stroke: s.colour,
        "stroke-width": 2,
        "data-type": s.label,
        "data-points": pts.length,
      });
      g.append(line);
      if (pts.length < 30) {
        for (const p of pts) {
          g.append(svg("circle", { cx: x(p[0]), cy: y(Math.min(opts.max, p[1])), r: 3, fill: s.colour },
            svg("title", {}, s.label + ": " + opts.tick(p[1]))));
        }
      }
    }
    return g;
  }

  function legend(series) {
    return el(
      "div",
      { class: "d-flex flex-wrap gap-3 small" },
      ...series.map((s) => {
        const swatch = el("span", { class: "d-inline-block me-1 rounded" });
        swatch.style.width = "0.8rem";
        swatch.style.height = "0.8rem";
        swatch.style.background = s.colour;
        const last = s.points.length ? s.points[s.points.length - 1][1] : null;
        return el("span", { "data-legend": s.label }, swatch,
          s.label + (last === null ? ": no samples yet" : ": " + Math.round(last) + " % now"));
      }),
    );
  }

  function renderUtilisation(data) {
    const to = data.time, from = to - 24 * 3600;
    const types = Object.keys(data.utilisation);
    const series = types.map((t, i) => ({
      label: t,
      colour: COLOURS[i % COLOURS.length],
      points: data.utilisation[t],
    }));
    const xticks = [];
    for (let h = 24; h >= 0; h -= 6) {
      xticks.push([to - h * 3600, h ? "-" + h + " h" : "now"]);
    }
    const body = [
      chart(series, {
        from, to, max: 100, ticks: [0, 50, 100], tick: (v) => Math.round(v) + " %", xticks,
        label: "Mean GPU utilisation per type over 24 hours", cls: "gpulab-console-util-chart",
      }),
      legend(series),
    ];
    if (!types.length) body.push(el("p", { class: "small text-body-secondary mb-0" }, "No GPU types in the pool."));
    $("gpulab-console-util").replaceChildren(...body);
  }

  function renderQueues(data) {
    fill(
      "gpulab-console-queues",
      data.queues.map((q) =>
        el(
          "tr",
          { "data-user": q.user },
          el("td", {}, q.user + (q.server ? "/" + q.server : "")),
          el("td", {}, q.gpus + " × " + q.gpu_type),
          el("td", {}, q.pricing),
          el("td", { class: "text-end" }, money(data.currency, q.max_price)),
          el("td", { class: "text-end" }, money(data.currency, q.current_price)),
          el("td", {}, duration(q.waited_seconds) + " (#" + q.position + ")"),
          el("td", { class: "small" }, q.why),
        ),
      ),
      "Nobody is waiting.",
    );
    fill(
      "gpulab-console-preemptions",
      data.preemptions.map((p) =>
        el(
          "tr",
          { "data-user": p.user },
          el("td", {}, when(p.warned_at)),
          el("td", {}, p.user + (p.server ? "/" + p.server : "")),
          el("td", {}, p.gpu_type),
          el("td", {}, p.reason + (p.price ? " at " + data.currency + " " + p.price : "")),
          el("td", {}, p.status + (p.checkpoint ? ", checkpoint " + p.checkpoint : "")),
        ),
      ),
      "No preemptions recently.",
    );
  }

  function renderSpawns(data) {
    fill(
      "gpulab-console-spawns",
      data.spawns.map((s) => {
        const steps = el(
          "details",
          {},
          el("summary", { class: "small" }, s.steps.length + " steps"),
          el(
            "ol",
            { class: "small mb-0 ps-3" },
            ...s.steps.map((st) => el("li", {}, "+" + duration(st.at) + " " + st.message)),
          ),
        );
        const badge = s.outcome === "success" ? "text-bg-success" : s.outcome === "refused" ? "text-bg-secondary" : "text-bg-danger";
        return el(
          "tr",
          { "data-user": s.user },
          el("td", {}, s.user + (s.server ? "/" + s.server : "")),
          el("td", {}, s.spawner),
          el("td", {}, s.app || "—"),
          el("td", {}, el("span", { class: "badge " + badge }, s.outcome)),
          el("td", { class: "text-end" }, duration(s.duration_seconds)),
          el("td", {}, when(s.started)),
          el("td", {}, s.steps.length ? steps : "—"),
        );
      }),
      "No spawns since the hub started.",
    );
  }

  async function loadHub() {
    let resp, data = null;
    try {
      resp = await fetch(jh.base_url + "api/gpulab/admin/console", {
        headers: { "X-XSRFToken": jh.xsrf_token },
      });
      data = await resp.json();
    } catch (e) {
      data = null;
    }
    if (!resp || !resp.ok || !data) {
      $("gpulab-console-error").textContent =
        (data && (data.human || data.message)) ||
        "The hub's console answer is unavailable (" + (resp ? resp.status : "no answer") + ").";
      return null;
    }
    $("gpulab-console-error").textContent = "";
    renderSummary(data);
    renderCards(data);
    renderUtilisation(data);
    renderQueues(data);
    renderSpawns(data);
    $("gpulab-console-updated").textContent = "Updated " + new Date(data.time * 1000).toLocaleTimeString();
    return data;
  }

  // ---- billing's part ----------------------------------------------------------------------

  let billingSession = false;

  async function askBilling(path) {
    // Billing knows the admin by its own OAuth cookie: the first request of the page passes
    // through the hub's authorization (no confirmation for billing) by opening billing's page.
    if (!billingSession) {
      await fetch(billingBase, { credentials: "same-origin" });
      billingSession = true;
    }
    const resp = await fetch(billingBase.replace(/\/$/, "") + path, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (resp.status === 403) billingSession = false;
    return resp;
  }

  function byType(value, currency) {
    if (!value) return "";
    const entries = Array.isArray(value) ? value.map((v) => [v.type, v.total]) : Object.entries(value);
    return entries.map(([t, v]) => t + " " + currency + " " + v).join(", ");
  }

  function spendRows(list, currency) {
    return list.map((u) =>
      el("tr", { "data-user": u.user }, el("td", {}, u.user), el("td", { class: "text-end" }, money(currency, u.total))),
    );
  }

  function renderMoney(rev, currency) {
    const days = rev.days || [];
    const DAY = 86400;
    const points = days.map((d) => [Date.parse(d.date + "T12:00:00Z") / 1000, Number(d.total)]);
    const max = Math.max(1, ...points.map((p) => p[1]));
    const step = max > 10 ? Math.pow(10, Math.floor(Math.log10(max))) : 1;
    const top = Math.ceil(max / step) * step;
    const to = points.length ? points[points.length - 1][0] + DAY / 2 : Date.now() / 1000;
    const from = to - Math.max(days.length, 1) * DAY;
    const xticks = days.length
      ? [[points[0][0], days[0].date.slice(5)], [points[points.length - 1][0], days[days.length - 1].date.slice(5)]]
      : [];
    const g = chart([], {
      from, to, max: top, ticks: [0, top / 2, top], tick: (v) => String(Math.round(v * 100) / 100), xticks,
      label: "Revenue per day", cls: "gpulab-console-revenue-svg",
    });
    const W = 760, L = 44, R = 10, T = 10, B = 26, H = 200;
    const bw = Math.max(2, ((W - L - R) / Math.max(days.length, 1)) * 0.7);
    days.forEach((d, i) => {
      const [t, v] = points[i];
      const x = L + ((t - from) / (to - from)) * (W - L - R) - bw / 2;
      const h = (v / top) * (H - T - B);
      g.append(svg("rect", { x, y: H - B - h, width: bw, height: Math.max(h, 0), fill: "#0d6efd", "data-date": d.date },
        svg("title", {}, d.date + ": " + currency + " " + d.total)));
    });
    $("gpulab-console-revenue-chart").replaceChildren(g);
    fill(
      "gpulab-console-days",
      days.slice().reverse().map((d) =>
        el("tr", { "data-date": d.date }, el("td", {}, d.date), el("td", { class: "text-end" }, money(currency, d.total)),
          el("td", { class: "small" }, byType(d.by_type, currency))),
      ),
      "No revenue in these days.",
    );
    fill("gpulab-console-top", spendRows(rev.top || [], currency), "Nobody spent anything.");
    fill("gpulab-console-users", spendRows(rev.by_user || [], currency), "Nobody spent anything.");
    fill(
      "gpulab-console-credits",
      (rev.credits || []).map((c) =>
        el(
          "tr",
          { "data-account": c.account },
          el("td", {}, typeof c.when === "number" ? when(c.when) : String(c.when).replace("T", " ").slice(0, 16)),
          el("td", {}, c.account),
          el("td", { class: "text-end" }, money(currency, c.amount)),
          el("td", {}, c.kind),
          el("td", {}, c.by || "—"),
          el("td", { class: "small" }, c.reason || "—"),
        ),
      ),
      "No credits or refunds in these days.",
    );
  }

  async function loadMoney(currency) {
    const status = $("gpulab-console-money-status");
    if (!billingBase) {
      status.textContent = "This hub has no billing service: no money to show.";
      return;
    }
    let resp = null, rev = null;
    try {
      resp = await askBilling("/api/admin/revenue?days=30");
      rev = resp.ok ? await resp.json() : null;
    } catch (e) {
      rev = null;
    }
    if (!rev) {
      status.textContent = "Billing is not answering (" + (resp ? resp.status : "no connection") +
        "): revenue, spenders and credits cannot be shown now. The rest of the page is the hub's own.";
      status.className = "small text-danger mb-1";
      $("gpulab-console-money").hidden = true;
      return;
    }
    const total = (rev.days || []).reduce((sum, d) => sum + Number(d.total), 0);
    status.textContent = "Billing's ledger: " + currency + " " + total.toFixed(2) +
      " charged in 30 days (the same sums as the statements).";
    status.className = "small text-body-secondary mb-1";
    renderMoney(rev, rev.currency || currency);
    $("gpulab-console-money").hidden = false;
  }

  async function load() {
    const data = await loadHub();
    await loadMoney(data ? data.currency : "");
  }

  load();
  setInterval(() => {
    if (document.visibilityState === "visible") load();
  }, 30000);
})();
