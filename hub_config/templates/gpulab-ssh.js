// The home page's SSH card: how to connect (`ssh -p PORT NAME@HOST`, as the hub says it) and the
// user's public keys, listed, added (paste a .pub line, a title) and removed through
// /hub/api/gpulab/users/NAME/ssh-keys (hub_config/api/ssh.py) with the page's XSRF token. The
// hub checks every key (type, size, one account per key) and answers with the field and what is
// allowed; the page shows that answer as it is. Text goes in with textContent only.
(function () {
  "use strict";
  const card = document.getElementById("gpulab-ssh");
  if (!card) return;
  const jh = window.jhdata;
  const url = jh.base_url + "api/gpulab/users/" + encodeURIComponent(jh.user) + "/ssh-keys";
  const $ = (id) => document.getElementById(id);
  const { api, el } = window.gpulab;
  let busy = false;

  const call = (method, path, body) => api(method, url + (path || ""), body);

  function say(text, ok) {
    const p = $("gpulab-ssh-answer");
    p.textContent = text;
    p.className = "small mt-1 mb-0 " + (ok ? "text-success" : "text-danger");
  }

  function day(iso) {
    return iso ? iso.replace("T", " ").replace(/:\d\dZ$/, " UTC") : "never";
  }

  function connect(data) {
    const box = $("gpulab-ssh-connect");
    if (!data.enabled) {
      box.replaceChildren(
        el(
          "p",
          { class: "small mb-2 text-body-secondary", id: "gpulab-ssh-off" },
          "SSH is off on this hub (its operator turns it on with GPULAB_SSH_PORT). Keys you " +
            "add here are kept for when it is on.",
        ),
      );
      return;
    }
    const sftp = "sftp -P " + data.port + " " + jh.user + "@" + data.host;
    const rsync =
      "rsync -av --partial -e 'ssh -p " + data.port + "' data/ " + jh.user + "@" + data.host +
      ":data/";
    box.replaceChildren(
      el("p", { class: "small mb-1" }, "Connect with one of your keys below (or a token of " +
        "yours as the password):"),
      el("pre", { class: "mb-1 p-2 bg-body-tertiary rounded small" },
        el("code", { id: "gpulab-ssh-command" }, data.command)),
      el("p", { class: "small mb-2 text-body-secondary" },
        "A shell or a command runs in your running server, with its GPUs. Files need no " +
        "server (nothing is billed for them): ",
        el("code", {}, sftp), ", ", el("code", {}, rsync), ". Port forwarding reaches your " +
        "own server's ports only."),
    );
  }

  function render(data) {
    connect(data);
    const body = $("gpulab-ssh-keys").querySelector("tbody");
    const rows = data.keys.map((k) =>
      el(
        "tr",
        { "data-fingerprint": k.fingerprint },
        el("td", {}, k.title || "(no title)"),
        el("td", {}, el("code", { class: "small" }, k.fingerprint)),
        el("td", { class: "small" }, k.type + (k.bits ? " " + k.bits : "")),
        el("td", { class: "small" }, day(k.added)),
        el("td", { class: "small" }, day(k.last_used)),
        el(
          "td",
          { class: "text-end" },
          el("button", {
            type: "button",
            class: "btn btn-sm btn-outline-danger gpulab-ssh-remove",
            textContent: "Remove",
            "aria-label": "Remove key " + (k.title || k.fingerprint),
            onclick: () => remove(k),
          }),
        ),
      ),
    );
    if (!rows.length) {
      rows.push(
        el("tr", { id: "gpulab-ssh-none" },
          el("td", { colSpan: 6, class: "small text-body-secondary" }, "No keys yet.")),
      );
    }
    body.replaceChildren(...rows);
    $("gpulab-ssh-count").textContent = data.keys.length + " of " + data.max_keys;
  }

  async function load() {
    const r = await call("GET");
    if (!r.ok) {
      say((r.data && r.data.message) || "Could not read your SSH keys (" + r.status + ").", false);
      return;
    }
    render(r.data);
  }

  async function remove(k) {
    if (busy) return;
    busy = true;
    try {
      const r = await call("DELETE", "/" + encodeURIComponent(k.fingerprint));
      if (r.ok) say("Removed " + (k.title || k.fingerprint) + ".", true);
      else say((r.data && r.data.message) || "Could not remove the key (" + r.status + ").", false);
      await load();
    } finally {
      busy = false;
    }
  }

  $("gpulab-ssh-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (busy) return;
    busy = true;
    const button = $("gpulab-ssh-add");
    button.disabled = true;
    try {
      const key = $("gpulab-ssh-key").value;
      const title = $("gpulab-ssh-title").value;
      if (/PRIVATE KEY|PuTTY-User-Key-File/.test(key)) {
        // Never sent anywhere: the hub would refuse it too, but it must not leave this machine.
        $("gpulab-ssh-key").value = "";
        say(
          "That is your PRIVATE key: it was not sent, and it must stay on your computer. Paste " +
            "the PUBLIC key instead (the .pub file, e.g. ~/.ssh/id_ed25519.pub).",
          false,
        );
        return;
      }
      const r = await call("POST", "", title.trim() ? { key, title } : { key });
      if (r.ok) {
        $("gpulab-ssh-key").value = "";
        $("gpulab-ssh-title").value = "";
        say("Added " + r.data.fingerprint + ".", true);
      } else {
        say((r.data && r.data.message) || "Could not add the key (" + r.status + ").", false);
      }
      await load();
    } finally {
      busy = false;
      button.disabled = false;
    }
  });

  load();
})();
