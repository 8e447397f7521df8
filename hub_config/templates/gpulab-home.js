// gpulab's home page: filled from /hub/api/gpulab/users/NAME/home; app tiles launch through
// /hub/api/gpulab/users/NAME/apps/APP/launch, then follow the spawn's real steps and the app's
// own readiness URL, and open the app. Text goes in with textContent only (names come from users
// and operators).
(function () {
  "use strict";
  const jh = window.jhdata;
  const api = (path) => jh.base_url + "api/gpulab/users/" + encodeURIComponent(jh.user) + path;
  const $ = (id) => document.getElementById(id);
  const { api: request, el } = window.gpulab;
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  let home = null;
  let launching = false;
  // Each tile's choices (GPU, Spot, max price) by app: a re-render (the 5 s refresh, an error)
  // puts them back instead of the defaults.
  const picked = {};

  function money(v) {
    return home.currency + " " + Number(v).toFixed(2);
  }

  function hours(seconds) {
    if (seconds === null || seconds === undefined) return "";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  function renderBalance() {
    const b = home.balance;
    if (!b) {
      $("gpulab-balance-amount").textContent = "—";
      $("gpulab-time-left").textContent = home.balance_error || "Billing is off on this hub.";
    } else {
      $("gpulab-balance-amount").textContent = money(b.balance.exact ?? b.balance);
      const burn = Number((b.burn_rate_per_hour || {}).exact ?? b.burn_rate_per_hour ?? 0);
      $("gpulab-time-left").textContent =
        b.time_left_seconds !== null && burn > 0
          ? "About " + hours(b.time_left_seconds) + " left at " + money(burn) + " per hour"
          : "Nothing running: nothing is being charged.";
      const warn = $("gpulab-balance-warnings");
      warn.replaceChildren(
        ...(b.warnings || []).map((w) => el("p", { class: "text-warning small mb-1" }, w)),
      );
    }
    if (home.statement_url) {
      $("gpulab-statement-link").href = home.statement_url;
      $("gpulab-statement-link").classList.remove("d-none");
    }
  }

  function renderServer() {
    const s = home.server;
    const body = $("gpulab-server-body");
    const open = $("gpulab-open");
    const sw = $("gpulab-switch");
    if (!s) {
      body.replaceChildren(el("p", { class: "mb-0" }, "No server running. Launch an app below."));
      open.classList.add("d-none");
      sw.classList.add("d-none");
      return;
    }
    const state = s.ready ? "running" : s.pending || "starting";
    const lines = [
      el("span", { class: "badge text-bg-" + (s.ready ? "success" : "warning") + " me-2" }, state),
      el("strong", {}, (s.app_name || "Server") + " on " + (s.mode || s.gpu || "")),
    ];
    const details = [];
    if (s.pricing) details.push(s.pricing);
    if (s.price_per_hour) details.push(money(s.price_per_hour) + " per hour" + priceNote(s.price_kind));
    if (s.cost_so_far) details.push("≈ " + money(s.cost_so_far) + " so far");
    body.replaceChildren(
      el("p", { class: "mb-1" }, ...lines),
      el("p", { class: "mb-0 small", id: "gpulab-server-details" }, details.join(" · ")),
    );
    open.href = s.app_url || s.url;
    open.textContent = "Open " + (s.app_name || "server");
    open.classList.toggle("d-none", !s.ready);
    // The no-GPU toggle: same home, other mode (the switch API restarts the server).
    if (s.ready && s.pricing !== "spot" && s.app === "jupyterlab") {
      const toGpu = s.gpu === "none";
      const target = toGpu ? home.pool.find((t) => t.free > 0) : null;
      if (!toGpu || target) {
        sw.textContent = toGpu ? "Switch to " + target.display_name : "Switch to no-GPU mode";
        sw.dataset.gpu = toGpu ? target.slug : "none";
        sw.classList.remove("d-none");
      } else {
        sw.classList.add("d-none");
      }
    } else {
      sw.classList.add("d-none");
    }
  }

  // The server's cards as the hub measures them (GET .../gpu): one line on the server's card,
  // the idle nudge (the Switch button above moves it to no-GPU mode) or how busy they are. The
  // last line is put back at once (renderServer rebuilt the card) and replaced once read.
  let gpuLine = null;
  async function renderGpu() {
    const s = home.server;
    const body = $("gpulab-server-body");
    if (!s || !s.ready || s.gpu === "none") {
      gpuLine = null;
      return;
    }
    if (gpuLine) body.append(gpuLine);
    let r;
    try {
      r = await request("GET", api("/gpu"));
    } catch (e) {
      return; // the hub did not answer: keep the last line
    }
    const cards = r.ok ? r.data.cards.filter((c) => c.util_pct !== null) : [];
    const nudge = r.ok ? r.data.nudge : null;
    const line = cards.length
      ? el(
          "p",
          {
            id: "gpulab-gpu-line",
            class: "mb-0 small " + (nudge ? "text-warning-emphasis fw-semibold" : "text-body-secondary"),
          },
          nudge
            ? nudge.text
            : "GPU " + Math.round(cards.reduce((sum, c) => sum + c.util_pct, 0) / cards.length) +
                " % busy (measured by the hub)",
        )
      : null;
    if (gpuLine && gpuLine.isConnected) gpuLine.remove();
    gpuLine = line;
    if (line && home.server && home.server.ready) $("gpulab-server-body").append(line);
  }

  function renderPool() {
    // Types with no card on this node are the catalog's, not this pool's: not shown.
    const rows = home.pool.filter((t) => t.total > 0).map((t) =>
      el(
        "tr",
        { "data-gpu": t.slug },
        el("td", {}, t.display_name + (t.simulated ? " (simulated)" : "")),
        el("td", {}, t.vram_gb + " GB"),
        el("td", { class: "gpulab-free" }, t.free + " / " + t.total),
        el("td", {}, money(t.price_per_hour) + (t.price_kind === "education" ? " (education)" : "")),
        el("td", {}, t.spot_price ? money(t.spot_price) : "—"),
      ),
    );
    $("gpulab-pool").tBodies[0].replaceChildren(...rows);
  }

  function gpuLabel(slug) {
    if (slug === "none") return home.no_gpu.display_name;
    const t = home.pool.find((p) => p.slug === slug);
    return t ? t.display_name : slug;
  }

  function priceNote(kind) {
    // The hub's kinds: "education" or "spot" (a running server's: "education price", "spot price").
    if (/^education/.test(kind || "")) return " (education price)";
    if (/^spot/.test(kind || "")) return " (spot price now)";
    return "";
  }

  function freeCards(slug) {
    const t = home.pool.find((p) => p.slug === slug);
    return t ? t.free : 0;
  }

  // What a click starts with the tile's current choices: the hub's plan for that GPU choice and
  // pricing (priced by the same function billing uses), never a price worked out here.
  function planText(app, gpu, spot) {
    const row = (app.plans || {})[gpu || ""] || {};
    const plan = row[spot ? "spot" : "on-demand"] || app.plan || {};
    if (plan.refused) return plan.refused;
    if (!plan.gpu) return "";
    return "Now: " + gpuLabel(plan.gpu) + " at " + money(plan.price_per_hour) + " per hour" +
      priceNote(plan.price_kind);
  }

  function renderApps() {
    const tiles = home.apps.map((app) => {
      const needs = app.needs_gpu
        ? "Needs a GPU" + (app.min_vram_gb ? " with " + app.min_vram_gb + " GB VRAM or more" : "")
        : "Runs on a GPU or in no-GPU mode";
      const controls = [];
      const choice = picked[app.slug] || (picked[app.slug] = { gpu: "", spot: false, maxPrice: "" });
      let gpuSelect = null;
      if (app.available && app.gpu_choices.length > 1) {
        gpuSelect = el(
          "select",
          { class: "form-select form-select-sm gpulab-gpu", "aria-label": "GPU for " + app.display_name },
          el("option", { value: "" }, "Cheapest free that fits"),
          // A type with no free card is shown, and said to be full, but cannot be picked.
          ...app.gpu_choices.map((g) => {
            const full = g !== "none" && freeCards(g) < 1;
            const text = g === "none" ? gpuLabel(g) : gpuLabel(g) + " (" + freeCards(g) + " free)";
            return el("option", { value: g, disabled: full }, text + (full ? ": unavailable" : ""));
          }),
        );
        gpuSelect.value = choice.gpu;
        if (gpuSelect.value !== choice.gpu) gpuSelect.value = choice.gpu = "";
        controls.push(gpuSelect);
      }
      const spot = el("input", { type: "checkbox", class: "form-check-input gpulab-spot" });
      spot.checked = choice.spot;
      // Text, not type=number: a number field hands an unreadable entry ("abc", "1e") over as "",
      // which launched with the default price without a word. The hub reads what was typed and
      // says what is wrong with it.
      const maxPrice = el("input", {
        type: "text",
        inputMode: "decimal",
        class: "form-control form-control-sm gpulab-max-price",
        placeholder: "max " + home.currency + "/h",
        "aria-label": "max price per hour",
      });
      maxPrice.value = choice.maxPrice;
      if (app.available && app.gpu_choices.some((g) => g !== "none")) {
        controls.push(
          el(
            "div",
            { class: "d-flex align-items-center gap-2" },
            el("label", { class: "form-check-label small text-nowrap" }, spot, " Spot"),
            maxPrice,
          ),
        );
      }
      // One server per user: while it runs, its app opens and the others wait for a stop.
      const running = home.server;
      const busy = running && running.app !== app.slug;
      const nowText = () =>
        !app.available
          ? "Unavailable: " + app.reason
          : busy
            ? "Your server runs " + (running.app_name || "another app") + ": stop it to launch this."
            : planText(app, choice.gpu, choice.spot);
      const planLine = el("p", { class: "small mb-0 gpulab-plan" }, nowText());
      // The "Now:" line follows the GPU and Spot choices; all three survive a re-render.
      const follow = () => {
        choice.gpu = gpuSelect ? gpuSelect.value : "";
        choice.spot = spot.checked;
        choice.maxPrice = maxPrice.value;
        planLine.textContent = nowText();
      };
      if (gpuSelect) gpuSelect.addEventListener("change", follow);
      spot.addEventListener("change", follow);
      maxPrice.addEventListener("input", follow);
      const button = el(
        "button",
        {
          type: "button",
          class: "btn btn-primary gpulab-launch",
          disabled: !app.available || launching || busy,
        },
        (running && !busy ? "Open " : "Launch ") + app.display_name,
      );
      button.addEventListener("click", () => {
        const body = {};
        if (gpuSelect && gpuSelect.value) body.gpu = gpuSelect.value;
        if (spot.checked) {
          body.pricing = "spot";
          if (maxPrice.value.trim()) body.max_price = maxPrice.value.trim();
        }
        launch(app, body);
      });
      return el(
        "div",
        { class: "col-sm-6 col-lg-3" },
        el(
          "div",
          {
            class: "card h-100 gpulab-app-tile" + (app.available ? "" : " opacity-50"),
            "data-app": app.slug,
          },
          el(
            "div",
            { class: "card-body d-flex flex-column gap-2" },
            el("h3", { class: "h6 card-title mb-0" }, app.display_name),
            el("p", { class: "small mb-0" }, app.description),
            el("p", { class: "small text-body-secondary mb-0" }, needs),
            planLine,
            ...controls,
            el("div", { class: "mt-auto" }, button),
          ),
        ),
      );
    });
    $("gpulab-apps").replaceChildren(...tiles);
  }

  function renderLastLaunch() {
    let last = null;
    try {
      last = JSON.parse(localStorage.getItem("gpulab-last-launch") || "null");
    } catch (e) {
      last = null;
    }
    $("gpulab-last-launch").textContent = last
      ? "Your last launch: " + last.app + " was ready in " + last.total.toFixed(1) + " s (" +
        "server " + last.server.toFixed(1) + " s, app start " + last.app_start.toFixed(1) +
        " s, model load " + last.model_load.toFixed(1) + " s). The reference cloud promises " +
        home.reference_launch_seconds + " s."
      : "";
  }

  async function refresh() {
    const r = await request("GET", api("/home"));
    if (!r.ok) return;
    home = r.data;
    renderBalance();
    renderServer();
    renderGpu();
    renderPool();
    if (!launching) renderApps();
    renderLastLaunch();
  }

  // ---- launching -----------------------------------------------------------------------------

  function step(text) {
    $("gpulab-launch-steps").append(el("li", {}, text));
  }

  // The hub's refusals carry a plain sentence for people (human) next to the API's message.
  function plain(data, fallback) {
    return (data && (data.human || data.message)) || fallback;
  }

  function confirmBox() {
    let box = $("gpulab-launch-confirm");
    if (!box) {
      box = el("div", { id: "gpulab-launch-confirm", class: "d-flex gap-2 mt-2" });
      $("gpulab-launch-error").after(box);
    }
    return box;
  }

  // A value the hub accepts only when confirmed (a max price above ten times on-demand): say why
  // and let the person confirm it, or change it.
  function askConfirm(app, body, data) {
    fail(plain(data, "Please confirm."));
    const yes = el(
      "button",
      { type: "button", class: "btn btn-sm btn-warning", id: "gpulab-confirm-yes" },
      "Yes, launch with this max price",
    );
    const no = el(
      "button",
      { type: "button", class: "btn btn-sm btn-outline-secondary", id: "gpulab-confirm-no" },
      "No, let me change it",
    );
    yes.addEventListener("click", () => launch(app, { ...body, [data.confirm]: true }));
    no.addEventListener("click", () => {
      confirmBox().replaceChildren();
      $("gpulab-launch-panel").classList.add("d-none");
    });
    confirmBox().replaceChildren(yes, no);
  }

  function fail(text) {
    confirmBox().replaceChildren();
    $("gpulab-launch-error").textContent = text;
    $("gpulab-launch-bar").classList.add("bg-danger");
    launching = false;
    renderApps();
  }

  async function launch(app, body) {
    const t0 = performance.now();
    const secs = () => (performance.now() - t0) / 1000;
    launching = true;
    renderApps();
    $("gpulab-launch-panel").classList.remove("d-none");
    $("gpulab-launch-title").textContent = "Launching " + app.display_name;
    $("gpulab-launch-steps").replaceChildren();
    $("gpulab-launch-error").textContent = "";
    confirmBox().replaceChildren();
    $("gpulab-launch-time").textContent = "";
    const bar = $("gpulab-launch-bar");
    bar.classList.remove("bg-danger");
    bar.style.width = "5%";

    const r = await request("POST", api("/apps/" + encodeURIComponent(app.slug) + "/launch"), body);
    if (!r.ok && r.data && r.data.confirm) return askConfirm(app, body, r.data);
    if (!r.ok) return fail(plain(r.data, "Launch refused (" + r.status + ")"));
    const launchInfo = r.data;
    if (launchInfo.status === "queued") {
      step(plain(launchInfo, "Queued."));
      launching = false;
      return;
    }
    if (launchInfo.status === "starting") {
      step("Picked " + gpuLabel(launchInfo.gpu) + " at " + money(launchInfo.price_per_hour) +
        " per hour (" + secs().toFixed(1) + " s)");
      let shown = 0;
      for (;;) {
        const s = await request("GET", api("/launch"));
        if (s.ok) {
          for (const ev of s.data.events.slice(shown)) {
            step(ev.message);
            bar.style.width = Math.max(5, Math.min(60, ev.progress * 0.6)) + "%";
          }
          shown = s.data.events.length;
          if (s.data.failed) return fail(s.data.failed_human || s.data.failed);
          if (s.data.ready) break;
          if (!s.data.active) return fail("The server stopped before it was ready.");
        }
        await sleep(200);
      }
    }
    const tServer = secs();
    let tAppUp = tServer;
    if (!app.is_server) {
      step("Starting " + app.display_name + " (" + tServer.toFixed(1) + " s)");
      bar.style.width = "70%";
      let loadingShown = false;
      let up = false;
      for (;;) {
        // The app lives on the user's own origin, which this page may not fetch: the hub asks
        // the app for us (the launch status's app_probe: its readiness URL's status, 0 when
        // nothing answers yet, and the stage of gpulab's status endpoint).
        const s = await request("GET", api("/launch"));
        const probe = s.ok ? s.data.app_probe : null;
        if (s.ok && s.data.failed) return fail(s.data.failed_human || s.data.failed); // the hub ended the launch
        if (s.ok && !s.data.active) return fail("The server stopped before it was ready.");
        if (probe && !up && probe.status && probe.status !== 502) {
          up = true;
          tAppUp = secs();
        }
        if (probe && probe.status === 200) break;
        // An app that cannot become ready (404, a failed stage, no model) is the hub's to end:
        // its verdict (s.data.failed, above) says why and what it costs.
        if (up && !loadingShown) {
          loadingShown = true;
          step("Loading the model (" + secs().toFixed(1) + " s)");
          bar.style.width = "85%";
        }
        if (secs() > app.timeout + 60) return fail(app.display_name + " did not become ready.");
        await sleep(250);
      }
    }
    const total = secs();
    bar.style.width = "100%";
    const timing = {
      app: app.display_name,
      total,
      server: tServer,
      app_start: tAppUp - tServer,
      model_load: total - tAppUp,
    };
    try {
      localStorage.setItem("gpulab-last-launch", JSON.stringify(timing));
    } catch (e) {
      // private mode: the timing is still shown below
    }
    $("gpulab-launch-time").textContent =
      app.display_name + " ready in " + total.toFixed(1) + " s (server " + tServer.toFixed(1) +
      " s, app start " + timing.app_start.toFixed(1) + " s, model load " +
      timing.model_load.toFixed(1) + " s; reference cloud: " + home.reference_launch_seconds +
      " s). Opening…";
    launching = false;
    window.location.assign(launchInfo.url);
  }

  $("gpulab-switch").addEventListener("click", async (ev) => {
    const gpu = ev.currentTarget.dataset.gpu;
    ev.currentTarget.disabled = true;
    const r = await request("POST", api("/switch"), { gpu });
    ev.currentTarget.disabled = false;
    if (!r.ok) {
      $("gpulab-server-body").append(
        el("p", { class: "text-danger small mb-0" }, plain(r.data, "Switch refused")),
      );
    }
    refresh();
  });

  refresh();
  setInterval(() => {
    if (!launching && document.visibilityState === "visible") refresh();
  }, 5000);
})();
