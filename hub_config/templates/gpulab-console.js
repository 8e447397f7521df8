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

  // Hub prices are decimal strings; billing's money is {micro, exact, display} (display: the
  // statements' rounding), shown as the statements show it.
  function money(currency, amount) {
    if (amount === null || amount === undefined || amount === "") return "—";
    if (typeof amount === "object") {
      // A sum below a cent that is not zero: its exact value (the statements' exact figure),
      // not a rounded 0.00 that hides who spent something.
      const tiny = Number(amount.micro) !== 0 && Number(amount.display) === 0;
      return currency + " " + (tiny ? amount.exact : amount.display);
    }
    return currency + " " + amount;
  }
  const exact = (amount) => Number(typeof amount === "object" && amount ? amount.exact : amount);

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
    if (c.idle_seconds === null || c.idle_seconds === undefined) {
      // No utilisation figure (not read yet, or NVML gives none for this card): not idle.
      return el(
        "span",
        {
          class: "badge text-bg-secondary",
          "data-activity": "unknown",
          title: "No utilisation figure for this card (not read yet, or NVML gives none)",
        },
        "n/a",
      );
    }
    const idle = "idle " + Math.floor(c.idle_seconds / 60) + " min";
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
    for (const o of data.offline) {
      if (!byNode.has(o.node)) byNode.set(o.node, []);
    }
    const blocks = [];
    for (const [node, cards] of byNode) {
      const off = data.offline.filter((o) => o.node === node);
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
          el("td", { class: "text-end" }, c.price_per_hour ? money(data.currency, c.price_per_hour) : "—"),
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
            el("th", { scope: "col", class: "text-end" }, "Price per card-hour"),
            el("th", { scope: "col" }, "Activity"),
          ),
        ),
        el("tbody", {}, ...rows),
      );
      const held = cards.filter((c) => c.state === "held").length;
      blocks.push(el("h3", { class: "h6 mt-2" }, "Node " + node + " · " + held + " of " + cards.length + " held"));
      for (const o of off) {
        blocks.push(
          el(
            "p",
            { class: "small text-danger mb-1", "data-offline": o.type },
            o.cards + " " + o.type + " card" + (o.cards === 1 ? "" : "s") + " offline (the node takes no servers now)" +
              (o.simulated ? ", simulated" : ""),
          ),
        );
      }
      if (cards.length) blocks.push(table);
    }
    if (!blocks.length) blocks.push(el("p", { class: "text-body-secondary" }, "No cards in the pool."));
    $("gpulab-console-nodes").replaceChildren(...blocks);
  }

  function renderSummary(data) {
    const n = (state) => data.cards.filter((c) => c.state === state).length;
    const offline = data.offline.reduce((sum, o) => sum + o.cards, 0);
    const held = data.cards.filter((c) => c.state === "held");
    const busy = held.filter((c) => c.busy).length;
    // Held cards with no utilisation figure are neither busy nor idle.
    const unknown = held.filter((c) => !c.busy && (c.idle_seconds === null || c.idle_seconds === undefined)).length;
    const simulated = data.cards.some((c) => c.simulated);
    $("gpulab-console-summary").replaceChildren(
      el(
        "span",
        {},
        data.cards.length + offline + " cards: " + n("free") + " free, " + held.length + " held (" + busy +
          " busy, " + (held.length - busy - unknown) + " idle" + (unknown ? ", " + unknown + " n/a" : "") +
          "), " + n("reserved") + " reserved, " + offline + " offline. " + data.queues.length +
          " waiting in queues.",
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
    const types = Object.keys(data.utilisation);
    const series = types.map((t, i) => ({
      label: t,
      colour: COLOURS[i % COLOURS.length],
      points: data.utilisation[t],
    }));
    // The window fits the history the sampler has (it keeps 24 hours): a hub that started an
    // hour ago shows that hour, not a day of nothing.
    const first = Math.min(data.time, ...series.flatMap((s) => s.points.map((p) => p[0])));
    const hours = [1, 3, 6, 12, 24].find((h) => data.time - first <= h * 3600) || 24;
    const to = data.time, from = to - hours * 3600;
    $("gpulab-console-util-title").textContent =
      "Utilisation over the last " + (hours === 1 ? "hour" : hours + " hours");
    const xticks = [];
    for (let i = 4; i >= 0; i--) {
      const ago = (hours * 60 * i) / 4; // minutes
      xticks.push([to - ago * 60, ago ? "-" + (ago >= 60 ? ago / 60 + " h" : ago + " min") : "now"]);
    }
    const body = [
      chart(series, {
        from, to, max: 100, ticks: [0, 50, 100], tick: (v) => Math.round(v) + " %", xticks,
        label: "Mean GPU utilisation per type over " + hours + " h", cls: "gpulab-console-util-chart",
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

  // Billing knows the admin by its own OAuth session, and (as every JupyterHub service) accepts
  // a script's request on that session only with its XSRF token. Both come from one visit of
  // billing's page in a hidden frame: a navigation, so the hub's OAuth authorization runs (no
  // confirmation for billing) and billing sets its cookies (the XSRF one under its own path,
  // read here through the same-origin frame). Billing then checks admin:users itself.
  let billingXsrf = null;
  // A billing that does not answer (stopped, overloaded) is said so after this long.
  const BILLING_TIMEOUT_MS = 10000;

  function billingLogIn() {
    return new Promise((resolve) => {
      const frame = el("iframe", { src: billingBase, title: "billing session", "aria-hidden": "true" });
      frame.hidden = true;
      const done = (token) => {
        clearTimeout(timer);
        frame.remove();
        resolve(token);
      };
      const timer = setTimeout(() => done(null), BILLING_TIMEOUT_MS);
      frame.addEventListener("load", () => {
        let token = null;
        try {
          const found = frame.contentDocument.cookie.split("; ").find((c) => c.startsWith("_xsrf="));
          token = found ? decodeURIComponent(found.slice(6)) : null;
        } catch (e) {
          token = null;
        }
        done(token);
      });
      document.body.append(frame);
    });
  }

  async function askBilling(path) {
    if (!billingXsrf) billingXsrf = await billingLogIn();
    if (!billingXsrf) return null;
    const resp = await fetch(billingBase.replace(/\/$/, "") + path, {
      credentials: "same-origin",
      headers: { Accept: "application/json", "X-XSRFToken": billingXsrf },
      signal: AbortSignal.timeout(BILLING_TIMEOUT_MS),
    });
    if (resp.status === 403) billingXsrf = null; // a session ended: log in again next time
    return resp;
  }

  function byType(value, currency) {
    if (!value) return "";
    return Object.entries(value)
      .filter(([, v]) => exact(v) !== 0)
      .map(([t, v]) => t + " " + money(currency, v))
      .join(", ");
  }

  function spendRows(list, currency) {
    return list.map((u) =>
      el(
        "tr",
        { "data-user": u.user },
        el("td", {}, u.user),
        el(
          "td",
          { class: "text-end", title: u.total && u.total.exact ? "exactly " + u.total.exact : "" },
          money(currency, u.total),
          u.paid_by_course && exact(u.paid_by_course)
            ? el("div", { class: "small text-body-secondary" }, money(currency, u.paid_by_course) + " by course pools")
            : null,
        ),
      ),
    );
  }

  function renderMoney(rev, currency) {
    const days = rev.days || [];
    const DAY = 86400;
    const points = days.map((d) => [Date.parse(d.date + "T12:00:00Z") / 1000, exact(d.total)]);
    const max = Math.max(0.01, ...points.map((p) => p[1]));
    const step = Math.pow(10, Math.floor(Math.log10(max)));
    const top = Math.ceil(max / step) * step;
    const decimals = Math.max(0, -Math.floor(Math.log10(top / 2)));
    const to = points.length ? points[points.length - 1][0] + DAY / 2 : Date.now() / 1000;
    const from = to - Math.max(days.length, 1) * DAY;
    const xticks = days.length
      ? [[points[0][0], days[0].date.slice(5)], [points[points.length - 1][0], days[days.length - 1].date.slice(5)]]
      : [];
    const g = chart([], {
      from, to, max: top, ticks: [0, top / 2, top], tick: (v) => v.toFixed(decimals), xticks,
      label: "Revenue per day", cls: "gpulab-console-revenue-svg",
    });
    const W = 760, L = 44, R = 10, T = 10, B = 26, H = 200;
    const bw = Math.max(2, ((W - L - R) / Math.max(days.length, 1)) * 0.7);
    days.forEach((d, i) => {
      const [t, v] = points[i];
      const x = L + ((t - from) / (to - from)) * (W - L - R) - bw / 2;
      const h = (v / top) * (H - T - B);
      g.append(svg("rect", { x, y: H - B - h, width: bw, height: Math.max(h, 0), fill: "#0d6efd", "data-date": d.date },
        svg("title", {}, d.date + ": " + money(currency, d.total))));
    });
    $("gpulab-console-revenue-chart").replaceChildren(g);
    fill(
      "gpulab-console-days",
      days.slice().reverse().filter((d) => exact(d.total) !== 0).map((d) =>
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
          el("td", {}, when(Date.parse(c.when) / 1000)),
          el("td", {}, c.account + (c.user && c.account !== "user:" + c.user ? " (" + c.user + ")" : "")),
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
      rev = resp && resp.ok ? await resp.json() : null;
    } catch (e) {
      rev = null;
      billingXsrf = null;
    }
    if (!rev) {
      const refused = resp && resp.status < 500;
      status.textContent =
        (refused ? "Billing refused the request (" + resp.status + ")" : "Billing is not answering (" +
          (resp ? resp.status : "no answer within " + BILLING_TIMEOUT_MS / 1000 + " s") + ")") +
        ": revenue, spenders and credits cannot be shown now. The rest of the page is the hub's own.";
      status.className = "small text-danger mb-1";
      $("gpulab-console-money").hidden = true;
      return;
    }
    const cur = rev.currency || currency;
    status.textContent = "Billing's ledger: " + money(cur, rev.total) +
      " charged in the last 30 days (the statements' sums)" +
      (rev.credits_truncated ? "; the newest " + rev.credits.length + " of " + rev.credits_count + " credits listed." : ".");
    status.className = "small text-body-secondary mb-1";
    renderMoney(rev, cur);
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
