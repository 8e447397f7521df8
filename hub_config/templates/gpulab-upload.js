// The upload page: each chosen file is uploaded in chunks to /hub/api/users/NAME/uploads
// (POST to start, PATCH per chunk with Upload-Offset), showing its progress, speed and time
// left. A dropped connection is resumed: the page asks the hub for the offset (HEAD) and goes
// on from there. Text goes in with textContent only (file names come from users).
(function () {
  "use strict";
  const jh = window.jhdata;
  const root = document.getElementById("gpulab-upload");
  const chunkBytes = Number(root.dataset.chunkBytes) || 8 * 1024 * 1024;
  const api = jh.base_url + "api/users/" + encodeURIComponent(jh.user) + "/uploads";
  const $ = (id) => document.getElementById(id);
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const MAX_DROPS = 20;

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return (i === 0 ? String(n) : n.toFixed(1)) + " " + units[i];
  }

  function duration(seconds) {
    if (!isFinite(seconds)) return "…";
    if (seconds < 60) return Math.ceil(seconds) + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min " + (Math.ceil(seconds) % 60) + " s";
    return (seconds / 3600).toFixed(1) + " h";
  }

  async function startUpload(path, size) {
    const resp = await fetch(api, {
      method: "POST",
      headers: { "X-XSRFToken": jh.xsrf_token, "Content-Type": "application/json" },
      body: JSON.stringify({ path, size }),
    });
    let data = null;
    try {
      data = await resp.json();
    } catch (e) {
      data = null;
    }
    return { ok: resp.ok, status: resp.status, data };
  }

  async function askOffset(id) {
    const resp = await fetch(api + "/" + id, { method: "HEAD", cache: "no-store" });
    if (!resp.ok) throw new Error("the hub no longer knows this upload (" + resp.status + ")");
    return Number(resp.headers.get("Upload-Offset"));
  }

  // One chunk; resolves with the hub's answer, rejects when the connection drops.
  function sendChunk(id, offset, blob, progress) {
    return new Promise((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      xhr.open("PATCH", api + "/" + id);
      xhr.setRequestHeader("Upload-Offset", String(offset));
      xhr.setRequestHeader("Content-Type", "application/offset+octet-stream");
      xhr.setRequestHeader("X-XSRFToken", jh.xsrf_token);
      xhr.upload.onprogress = (e) => progress(offset + e.loaded);
      xhr.onload = () => {
        let data = null;
        try {
          data = JSON.parse(xhr.responseText);
        } catch (e) {
          data = null;
        }
        resolve({ status: xhr.status, data });
      };
      xhr.onerror = () => reject(new Error("connection dropped"));
      xhr.onabort = () => reject(new Error("connection aborted"));
      xhr.ontimeout = () => reject(new Error("timed out"));
      xhr.send(blob);
    });
  }

  function fileRow(file, path) {
    const row = el("div", "card mb-2 gpulab-upload-file");
    row.dataset.path = path;
    const body = el("div", "card-body py-2");
    const head = el("div", "d-flex justify-content-between flex-wrap gap-2");
    head.append(el("span", "fw-semibold", path), el("span", "text-body-secondary small", bytes(file.size)));
    const bar = el("div", "progress-bar");
    bar.style.width = "0%";
    const progress = el("div", "progress my-1");
    progress.setAttribute("role", "progressbar");
    progress.setAttribute("aria-label", "upload of " + path);
    progress.append(bar);
    const stats = el("div", "small gpulab-upload-stats", "waiting");
    const note = el("div", "small text-body-secondary gpulab-upload-note");
    body.append(head, progress, stats, note);
    row.append(body);
    return { row, bar, stats, note };
  }

  async function uploadOne(file, path, ui) {
    const show = (done, speed) => {
      const pct = file.size ? (100 * done) / file.size : 100;
      ui.bar.style.width = pct.toFixed(1) + "%";
      ui.bar.textContent = Math.floor(pct) + "%";
      const left = speed > 0 ? (file.size - done) / speed : Infinity;
      ui.stats.textContent =
        Math.floor(pct) + " % · " + bytes(done) + " of " + bytes(file.size) +
        " · " + bytes(Math.round(speed)) + "/s · " + duration(left) + " left";
    };
    const started = await startUpload(path, file.size);
    if (!started.ok) {
      const why = started.data && started.data.message ? started.data.message : "refused (" + started.status + ")";
      throw new Error(why);
    }
    const id = started.data.id;
    let offset = started.data.offset;
    let complete = Boolean(started.data.complete);
    let drops = 0;
    // Speed over the last few seconds of progress.
    const samples = [[performance.now(), offset]];
    const progress = (done) => {
      const now = performance.now();
      samples.push([now, done]);
      while (samples.length > 2 && now - samples[0][0] > 5000) samples.shift();
      const [t0, b0] = samples[0];
      show(done, now > t0 ? ((done - b0) * 1000) / (now - t0) : 0);
    };
    while (!complete) {
      const blob = file.slice(offset, Math.min(offset + chunkBytes, file.size));
      let answer;
      try {
        answer = await sendChunk(id, offset, blob, progress);
      } catch (e) {
        drops += 1;
        if (drops > MAX_DROPS) throw new Error("the connection dropped " + drops + " times; try again later");
        ui.note.textContent = "Connection dropped; resuming (" + drops + ")…";
        await sleep(Math.min(500 * 2 ** (drops - 1), 10000));
        offset = await askOffset(id);
        samples.length = 0;
        samples.push([performance.now(), offset]);
        ui.note.textContent = "Resumed at " + bytes(offset) + " after " + drops + " dropped connection" + (drops > 1 ? "s" : "") + ".";
        continue;
      }
      if (answer.status === 200 && answer.data) {
        offset = answer.data.offset;
        complete = Boolean(answer.data.complete);
        progress(offset);
      } else if (answer.status === 409 && answer.data && typeof answer.data.offset === "number") {
        offset = answer.data.offset; // another chunk was still landing: go on from the hub's offset
        await sleep(500);
      } else {
        throw new Error(answer.data && answer.data.message ? answer.data.message : "refused (" + answer.status + ")");
      }
    }
    show(file.size, 0);
    ui.stats.textContent = "100 % · " + bytes(file.size) + " · done: ~/" + path;
    ui.bar.classList.add("bg-success");
    ui.row.classList.add("gpulab-upload-done");
  }

  $("gpulab-upload-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("gpulab-upload-error").textContent = "";
    const files = Array.from($("gpulab-upload-files").files);
    const folder = $("gpulab-upload-folder").value.trim().replace(/^\/+|\/+$/g, "");
    const button = $("gpulab-upload-start");
    button.disabled = true;
    try {
      for (const file of files) {
        const path = folder ? folder + "/" + file.name : file.name;
        const ui = fileRow(file, path);
        $("gpulab-upload-list").append(ui.row);
        try {
          await uploadOne(file, path, ui);
        } catch (e) {
          ui.bar.classList.add("bg-danger");
          ui.row.classList.add("gpulab-upload-failed");
          ui.stats.textContent = "Not uploaded: " + e.message;
        }
      }
    } finally {
      button.disabled = false;
    }
  });
})();
