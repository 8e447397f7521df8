// Storage on the hub's pages: window.gpulabStorage (sizes in words, a usage bar) for the home
// page's Storage card (filled here when #gpulab-storage is on the page) and the admin's list of
// the largest homes. Everything comes from the hub's storage API (its measurement, its prices):
// nothing is computed from what a server says, and no price is worked out here. Text goes in
// with textContent only.
(function () {
  "use strict";
  const jh = window.jhdata;
  const GiB = 1024 * 1024 * 1024;
  const { api, el } = window.gpulab;

  // 2**30 bytes is a GB here, as in the catalog.
  function size(bytes) {
    const b = Number(bytes) || 0;
    if (b >= GiB) return (b / GiB).toFixed(b >= 100 * GiB ? 0 : 1) + " GB";
    if (b >= 1024 * 1024) return (b / 1024 / 1024).toFixed(1) + " MB";
    if (b >= 1024) return (b / 1024).toFixed(0) + " KB";
    return b + " bytes";
  }

  function level(percent) {
    if (percent >= 95) return "critical";
    if (percent >= 80) return "warn";
    return "ok";
  }

  function bar(percent, label) {
    const lv = level(percent);
    const colour = lv === "critical" ? " bg-danger" : lv === "warn" ? " bg-warning" : "";
    const inner = el("div", { class: "progress-bar" + colour });
    inner.style.width = Math.min(100, Math.max(0, percent)) + "%";
    return el(
      "div",
      {
        class: "progress gpulab-storage-bar",
        role: "progressbar",
        "aria-label": label,
        "aria-valuenow": String(Math.round(percent)),
        "aria-valuemin": "0",
        "aria-valuemax": "100",
        "data-level": lv,
      },
      inner,
    );
  }

  function ago(t) {
    const s = Math.max(0, Math.round(Date.now() / 1000 - Number(t)));
    if (s < 5) return "just now";
    if (s < 120) return s + " s ago";
    return Math.round(s / 60) + " min ago";
  }

  window.gpulabStorage = { el, size, bar, level, ago };

  // ---- the home page's Storage card ----------------------------------------------------------

  const card = document.getElementById("gpulab-storage");
  if (!card) return;
  const url = jh.base_url + "api/users/" + encodeURIComponent(jh.user) + "/storage";
  const $ = (id) => document.getElementById(id);
  let data = null;
  let busy = false;

  const call = (method, query, body) => api(method, url + (query || ""), body);

  function plain(answer, fallback) {
    return (answer && (answer.human || answer.message)) || fallback;
  }

  function money(v) {
    const n = Number(v);
    if (n > 0 && n < 0.005) return "less than " + data.currency + " 0.01";
    return data.currency + " " + n.toFixed(2);
  }

  function render() {
    const h = data.home;
    const held =
      Number(h.used_bytes) + Number(data.datasets_bytes || 0) + Number(data.uploads_bytes || 0);
    $("gpulab-storage-used").textContent =
      size(held) + " of " + size(h.quota_bytes) + " (" + Math.round(data.percent) + " %)";
    $("gpulab-storage-bar").replaceChildren(bar(data.percent, "home usage"));
    const lines = [];
    if (Number(data.datasets_bytes) > 0) {
      lines.push("Includes " + size(data.datasets_bytes) + " in your published datasets.");
    }
    if (Number(data.uploads_bytes) > 0) {
      lines.push("Includes " + size(data.uploads_bytes) + " in unfinished uploads.");
    }
    lines.push(
      data.free_gb + " GB free; above it " + money(data.price_per_gb_day) +
        " per GB a day, no request fees. Your quota costs " +
        (Number(data.cost.per_day) > 0 ? money(data.cost.per_day) + " a day." : "nothing."),
    );
    if (h.files !== null && h.files !== undefined) {
      lines.push(
        h.files.toLocaleString() + " files" +
          (h.files_limit ? " of " + h.files_limit.toLocaleString() : "") +
          " · measured " + ago(h.measured_at) + ".",
      );
    }
    $("gpulab-storage-details").replaceChildren(
      ...lines.map((t) => el("p", { class: "small mb-1" }, t)),
    );
    const notes = [];
    if (data.notice) {
      notes.push(
        el(
          "div",
          {
            class: "alert py-1 px-2 small mb-1 " +
              (data.notice.level === "critical" ? "alert-danger" : "alert-warning"),
            role: "status",
            id: "gpulab-storage-notice",
            "data-level": data.notice.level,
          },
          data.notice.text,
        ),
      );
    }
    if (!data.enforced) {
      notes.push(
        el(
          "p",
          { class: "small text-body-secondary mb-1", id: "gpulab-storage-not-enforced" },
          "The quota is not enforced on this hub: usage is measured, but writes past it are " +
            "not stopped.",
        ),
      );
    } else if (!h.enforced) {
      // A hub that enforces quotas, and a home not in its own disk image yet (never started).
      notes.push(
        el(
          "p",
          { class: "small text-body-secondary mb-1", id: "gpulab-storage-not-yet" },
          "Your home moves into its own disk at your next start; from then on writes past the " +
            "quota fail.",
        ),
      );
    }
    if (data.release) {
      notes.push(
        el(
          "div",
          { class: "alert alert-warning py-1 px-2 small mb-1", id: "gpulab-storage-release" },
          "Your home will be released on " + String(data.release.at).slice(0, 10) + " (in " +
            data.release.days_left + " days) unless you start a server before then.",
        ),
      );
    }
    $("gpulab-storage-notes").replaceChildren(...notes);
    $("gpulab-storage-max").textContent = "(up to " + data.max_gb + " GB)";
  }

  async function refresh() {
    if (busy) return;
    const r = await call("GET");
    if (!r.ok) {
      $("gpulab-storage-used").textContent = plain(r.data, "Storage unavailable (" + r.status + ")");
      return;
    }
    data = r.data;
    render();
  }

  function say(text, kind) {
    const out = $("gpulab-storage-answer");
    out.className = "small mt-1 mb-0 " + (kind || "");
    out.textContent = text;
  }

  function cancel() {
    busy = false;
    $("gpulab-storage-confirm").replaceChildren();
  }

  // Step 1: the hub's price for the size typed (a GET that changes nothing); step 2: confirm.
  $("gpulab-storage-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    cancel();
    say("");
    const typed = $("gpulab-storage-quota").value.trim();
    if (!typed) return say("Type the quota you want, in GB.", "text-danger");
    const q = await call("GET", "?quota_gb=" + encodeURIComponent(typed));
    if (!q.ok) return say(plain(q.data, "Refused (" + q.status + ")"), "text-danger");
    data = q.data;
    render();
    const quote = q.data.quote;
    busy = true;
    const yes = el(
      "button",
      { type: "button", class: "btn btn-sm btn-primary", id: "gpulab-storage-yes" },
      "Set my quota to " + quote.quota_gb + " GB",
    );
    const no = el(
      "button",
      { type: "button", class: "btn btn-sm btn-outline-secondary", id: "gpulab-storage-no" },
      "Cancel",
    );
    yes.addEventListener("click", async () => {
      yes.disabled = true;
      const r = await call("POST", "", { quota_gb: Number(quote.quota_gb) });
      cancel();
      if (!r.ok) return say(plain(r.data, "Refused (" + r.status + ")"), "text-danger");
      data = r.data;
      render();
      say("Your quota is now " + r.data.home.quota_bytes / GiB + " GB.", "text-success");
    });
    no.addEventListener("click", () => {
      cancel();
      say("");
    });
    $("gpulab-storage-confirm").replaceChildren(
      el(
        "p",
        { class: "small mb-1", id: "gpulab-storage-quote" },
        quote.quota_gb + " GB will cost " +
          (Number(quote.per_day) > 0
            ? money(quote.per_day) + " a day (" + size(quote.billable_bytes) + " above the free " +
              data.free_gb + " GB), charged from your balance."
            : "nothing: it is within the free " + data.free_gb + " GB."),
      ),
      el("div", { class: "d-flex gap-2" }, yes, no),
    );
  });

  refresh();
  setInterval(() => {
    if (document.visibilityState === "visible") refresh();
  }, 30000);
})();
