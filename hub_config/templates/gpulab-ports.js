// The home page's Published ports card: the user's published ports (port, who may open them,
// their address), publishing one more and revoking, through /hub/api/gpulab/users/NAME/ports
// (hub_config/api/ports.py) with the page's XSRF token. The hub checks that the port is the
// user's server's own and answers with the field and what is allowed; the page shows that answer
// as it is. Text goes in with textContent only.
(function () {
  "use strict";
  const card = document.getElementById("gpulab-ports");
  if (!card) return;
  const jh = window.jhdata;
  const url = jh.base_url + "api/gpulab/users/" + encodeURIComponent(jh.user) + "/ports";
  const $ = (id) => document.getElementById(id);
  const { api, el } = window.gpulab;
  const WHO = { login: "Anyone logged in", public: "Anyone with the link" };
  let busy = false;

  const call = (method, path, body) => api(method, url + (path || ""), body);

  function say(text, ok) {
    const p = $("gpulab-ports-answer");
    p.textContent = text;
    p.className = "small mt-1 mb-0 " + (ok ? "text-success" : "text-danger");
  }

  function refusal(r, what) {
    const d = r.data || {};
    return d.human || d.message || what + " (" + r.status + ")";
  }

  function row(p) {
    const revoke = el("button", {
      type: "button",
      class: "btn btn-sm btn-outline-danger",
      textContent: "Revoke",
      "aria-label": "Revoke port " + p.port,
    });
    revoke.addEventListener("click", async () => {
      if (busy) return;
      busy = true;
      try {
        const r = await call("DELETE", "/" + p.port);
        if (r.ok) say("Port " + p.port + " is no longer published.", true);
        else say(refusal(r, "Could not revoke the port"), false);
      } finally {
        busy = false;
      }
      load();
    });
    const link = el("a", { href: p.url, target: "_blank", rel: "noopener", textContent: p.url });
    link.className = "font-monospace small text-break";
    return el(
      "tr",
      { "data-port": String(p.port) },
      el("td", { textContent: String(p.port) }),
      el("td", { textContent: WHO[p.access] || p.access }),
      el("td", {}, link),
      el("td", { class: "text-end" }, revoke),
    );
  }

  async function load() {
    const r = await call("GET");
    if (!r.ok) {
      say(refusal(r, "Could not read your published ports"), false);
      return;
    }
    const ports = r.data.ports || [];
    $("gpulab-ports-list").classList.toggle("d-none", ports.length === 0);
    $("gpulab-ports-list").querySelector("tbody").replaceChildren(...ports.map(row));
    if (!r.data.enabled) {
      $("gpulab-ports-publish").disabled = true;
      say("This hub serves users' servers on its own origin, where no port can be published.", false);
    }
  }

  $("gpulab-ports-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (busy) return;
    const text = $("gpulab-ports-port").value.trim();
    if (!/^\d+$/.test(text)) {
      say("Port: a number from 1024 to 65535.", false);
      return;
    }
    busy = true;
    $("gpulab-ports-publish").disabled = true;
    try {
      const access = $("gpulab-ports-access").value;
      const r = await call("POST", "", { port: Number(text), access });
      if (r.ok) {
        say("Port " + r.data.port + " is published: " + r.data.url, true);
        $("gpulab-ports-port").value = "";
      } else {
        say(refusal(r, "Could not publish the port"), false);
      }
    } finally {
      busy = false;
      $("gpulab-ports-publish").disabled = false;
    }
    load();
  });

  load();
})();
