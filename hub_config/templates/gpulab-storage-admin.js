// The admin's list of the largest homes: GET /hub/api/storage (the hub's own measurement, largest
// first), one row per home. Text goes in with textContent only (user names are users').
(function () {
  "use strict";
  const jh = window.jhdata;
  const { el, size, bar, ago } = window.gpulabStorage;
  const $ = (id) => document.getElementById(id);
  const grow = (node) => {
    node.style.flex = "1 1 auto";
    node.style.minWidth = "6rem";
    return node;
  };

  async function load() {
    const resp = await fetch(jh.base_url + "api/storage", {
      headers: { "X-XSRFToken": jh.xsrf_token },
    });
    let data = null;
    try {
      data = await resp.json();
    } catch (e) {
      data = null;
    }
    if (!resp.ok) {
      $("gpulab-storage-error").textContent =
        (data && (data.human || data.message)) || "Storage unavailable (" + resp.status + ")";
      return;
    }
    $("gpulab-storage-error").textContent = "";
    const total = data.homes.reduce((sum, h) => sum + Number(h.used_bytes), 0);
    // Each home's own answer: on a hub that enforces quotas, a home not yet moved into its
    // image is not enforced, and the summary says how many are.
    const loose = data.homes.filter((h) => !h.enforced).length;
    $("gpulab-storage-summary").textContent =
      data.homes.length + " homes, " + size(total) + " in all. " +
      (data.enforced
        ? "Quotas are enforced by the kernel (" + data.backend + " backend)" +
          (loose ? ", except for " + loose + " not yet in their images." : ".")
        : "Quotas are not enforced on this hub (" + data.backend +
          " backend): usage is measured, writes past a quota are not stopped.") +
      " Free " + data.free_gb + " GB each; " + data.currency + " " + data.price_per_gb_day +
      " per GB-day above. Measured " + ago(data.measured_at) + ".";
    const rows = data.homes.map((h) =>
      el(
        "tr",
        { "data-home": h.name },
        el("td", {}, h.user || h.name + " (no such user)"),
        el("td", { class: "text-end" }, size(h.used_bytes)),
        el("td", { class: "text-end" }, size(h.quota_bytes)),
        el(
          "td",
          {},
          el(
            "div",
            { class: "d-flex align-items-center gap-2" },
            grow(bar(h.percent, "usage of " + (h.user || h.name))),
            el("span", { class: "small text-nowrap" }, Math.round(h.percent) + " %"),
          ),
        ),
        el(
          "td",
          { class: "text-end" },
          h.files === null ? "—" : h.files.toLocaleString() +
            (h.files_limit ? " / " + h.files_limit.toLocaleString() : ""),
        ),
        el("td", { class: "text-end" }, h.datasets_bytes ? size(h.datasets_bytes) : "—"),
        el("td", {}, h.enforced ? "yes" : "no"),
        el("td", { class: "small" }, ago(h.measured_at)),
        el(
          "td",
          { class: "small" },
          h.release
            ? String(h.release.at).slice(0, 10) + " (in " + h.release.days_left + " days)"
            : "—",
        ),
      ),
    );
    if (!rows.length) {
      rows.push(el("tr", {}, el("td", { colSpan: 9, class: "text-body-secondary" }, "No homes yet.")));
    }
    $("gpulab-storage-homes").tBodies[0].replaceChildren(...rows);
  }

  load();
  setInterval(() => {
    if (document.visibilityState === "visible") load();
  }, 30000);
})();
