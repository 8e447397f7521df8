// What the hub's own page scripts share (the home page's cards, the storage admin page), so that
// each card does not carry its own copy: window.gpulab.api, a fetch to the hub's API with the
// page's XSRF token that sends and reads JSON, and window.gpulab.el, a small DOM builder. Text
// goes in with textContent or append only, never as HTML (names come from users and operators).
(function () {
  "use strict";
  const jh = window.jhdata;

  // el("tr", {class: "x", "data-port": "8080"}, child, "text", ...): class, data-*, aria-*, role
  // and title become attributes; any other key is set as a property (textContent, onclick, ...).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role" || k === "title") {
        node.setAttribute(k, v);
      } else node[k] = v;
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  // The hub's answer as {ok, status, data}; data is null where the body is empty or not JSON.
  async function api(method, url, body) {
    const opts = { method, headers: { "X-XSRFToken": jh.xsrf_token } };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const resp = await fetch(url, opts);
    let data = null;
    if (resp.status !== 204) {
      try {
        data = await resp.json();
      } catch (e) {
        data = null;
      }
    }
    return { ok: resp.ok, status: resp.status, data };
  }

  window.gpulab = { api, el };
})();
