// The home page's Jobs card: the user's training jobs (what runs, on what, its state and why it
// waits or how it ended, attempts, exit code), a Cancel button, a log viewer that follows the
// output as it comes, and a "Submit a job" form (command, GPU type, cards, nodes, spot with a
// bid), all through the hub's jobs API (/hub/api/gpulab/users/NAME/jobs) with the page's XSRF
// token. The hub checks every field and answers with the field and what is allowed; the page
// shows that answer as it is. Text goes in with textContent only (commands and names are the
// user's, reasons the hub's).
(function () {
  "use strict";
  const card = document.getElementById("gpulab-jobs");
  if (!card) return;
  const jh = window.jhdata;
  const url = jh.base_url + "api/gpulab/users/" + encodeURIComponent(jh.user) + "/jobs";
  const $ = (id) => document.getElementById(id);
  const { api, el } = window.gpulab;
  const TERMINAL = ["succeeded", "failed", "cancelled"];
  const BADGE = {
    queued: "secondary",
    starting: "warning",
    running: "success",
    succeeded: "primary",
    failed: "danger",
    cancelled: "dark",
  };
  const LOG_POLL_MS = 2000;
  const LIST_POLL_MS = 5000;
  let busy = false;
  let types = {}; // GPU type slug -> display name, from the pool
  let following = null; // {id, offset, done, timer, decoder}

  const call = (method, path, body) => api(method, url + (path || ""), body);

  function say(text, ok) {
    const p = $("gpulab-jobs-answer");
    p.textContent = text;
    p.className = "small mt-1 mb-0 " + (ok ? "text-success" : "text-danger");
  }

  function refusal(r, what) {
    const d = r.data || {};
    return d.human || d.message || what + " (HTTP " + r.status + ")";
  }

  function onWhat(job) {
    if (job.gpu === "none" || !job.gpus) return "No GPU";
    const name = types[job.gpu] || job.gpu;
    const per = name + " x" + job.gpus;
    const nodes = job.nodes > 1 ? " on " + job.nodes + " nodes" : "";
    return per + nodes + (job.pricing === "spot" ? " (spot" + (job.max_price ? ", bid " + job.max_price + "/card-h" : "") + ")" : "");
  }

  function seconds(s) {
    if (s === null || s === undefined) return "";
    if (s < 90) return Math.round(s) + " s";
    if (s < 5400) return Math.round(s / 60) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  function attemptsText(job) {
    const n = job.attempt_count ?? (job.attempts || []).length;
    const parts = [String(n)];
    const last = (job.attempts || [])[n - 1];
    if (n > 1 && last && last.resume_seconds !== null && last.resume_seconds !== undefined) {
      parts.push("resumed in " + seconds(last.resume_seconds));
    }
    if (job.lost_seconds) parts.push(seconds(job.lost_seconds) + " of work lost");
    return parts.join(" · ");
  }

  function row(job) {
    const done = TERMINAL.includes(job.state);
    const title = el(
      "div",
      {},
      el("strong", {}, "Job " + job.id),
      job.name ? el("span", { class: "ms-1" }, job.name) : null,
    );
    const command = el("code", { class: "small text-break gpulab-job-command" }, job.command);
    const state = el(
      "span",
      { class: "badge text-bg-" + (BADGE[job.state] || "secondary") + " gpulab-job-state" },
      job.state,
    );
    // Why it waits or how it ended (a reason that only repeats the state is left out).
    const why =
      job.reason && job.reason !== job.state
        ? el("div", { class: "small text-body-secondary gpulab-job-reason" }, job.reason)
        : null;
    const log = el("button", {
      type: "button",
      class: "btn btn-sm btn-outline-secondary gpulab-job-log",
      textContent: done ? "Log" : "Follow log",
      "aria-label": "Show the log of job " + job.id,
    });
    log.addEventListener("click", () => follow(job));
    const actions = el("td", { class: "text-end text-nowrap" }, log);
    if (!done) {
      const cancel = el("button", {
        type: "button",
        class: "btn btn-sm btn-outline-danger ms-1 gpulab-job-cancel",
        textContent: job.cancel_requested ? "Cancelling…" : "Cancel",
        disabled: !!job.cancel_requested,
        "aria-label": "Cancel job " + job.id,
      });
      cancel.addEventListener("click", () => cancelJob(job, cancel));
      actions.append(cancel);
    }
    return el(
      "tr",
      { "data-job": String(job.id), "data-state": job.state },
      el("td", {}, title, command),
      el("td", { class: "small" }, onWhat(job)),
      el("td", {}, state, why),
      el("td", { class: "small gpulab-job-attempts" }, attemptsText(job)),
      el("td", { class: "gpulab-job-exit" }, job.exit_code === null || job.exit_code === undefined ? "" : String(job.exit_code)),
      actions,
    );
  }

  async function cancelJob(job, button) {
    if (busy) return;
    busy = true;
    button.disabled = true;
    try {
      const r = await call("DELETE", "/" + job.id);
      if (r.ok) say("Job " + job.id + " is being cancelled: its servers stop and its cards are freed.", true);
      else say(refusal(r, "Could not cancel job " + job.id), false);
    } finally {
      busy = false;
    }
    load();
  }

  // ---- the log viewer: bytes from an offset, polled until the job has ended ----------------

  function logBox() {
    return $("gpulab-jobs-log-text");
  }

  function stopFollowing() {
    if (following && following.timer) clearTimeout(following.timer);
    following = null;
  }

  function follow(job) {
    stopFollowing();
    following = { id: job.id, offset: 0, done: false, timer: null, decoder: new TextDecoder() };
    $("gpulab-jobs-log").classList.remove("d-none");
    $("gpulab-jobs-log-title").textContent = "Log of job " + job.id + (job.name ? " (" + job.name + ")" : "");
    logBox().textContent = "";
    $("gpulab-jobs-log-state").textContent = "Reading…";
    readLog(following);
  }

  async function readLog(f) {
    if (following !== f) return;
    let more = false;
    try {
      const resp = await fetch(url + "/" + f.id + "/log?offset=" + f.offset, {
        headers: { "X-XSRFToken": jh.xsrf_token },
        cache: "no-store",
      });
      if (following !== f) return;
      if (!resp.ok) {
        let message = "";
        try {
          const d = await resp.json();
          message = d.human || d.message || "";
        } catch (e) {
          message = "";
        }
        $("gpulab-jobs-log-state").textContent = message || "The log could not be read (HTTP " + resp.status + ").";
        f.done = true;
        return;
      }
      // The bytes from the offset; where they end and the job's state when the hub read them
      // (a job that had ended then has no more output to come).
      const bytes = new Uint8Array(await resp.arrayBuffer());
      const text = f.decoder.decode(bytes, { stream: true });
      const header = resp.headers.get("X-Gpulab-Log-Offset");
      const next = header !== null ? Number(header) : f.offset + bytes.length;
      const state = resp.headers.get("X-Gpulab-Job-State");
      let ended = state !== null ? TERMINAL.includes(state) : null;
      if (following !== f) return;
      more = next > f.offset;
      f.offset = next;
      if (text) {
        const box = logBox();
        const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
        box.append(text);
        if (atEnd) box.scrollTop = box.scrollHeight;
      }
      if (ended === null) {
        const j = await call("GET", "/" + f.id);
        ended = j.ok ? TERMINAL.includes(j.data.state) : false;
        if (j.ok) f.state = j.data.state;
      } else {
        f.state = state;
      }
      f.done = ended && !more;
    } catch (e) {
      $("gpulab-jobs-log-state").textContent = "The hub did not answer; trying again…";
    }
    if (following !== f) return;
    if (f.done) {
      const rest = f.decoder.decode(); // a character the last read cut (none when whole)
      if (rest) logBox().append(rest);
      $("gpulab-jobs-log-state").textContent =
        "The job has ended" + (f.state ? " (" + f.state + ")" : "") + ": this is all of its output.";
      if (!logBox().textContent) logBox().textContent = "(no output)";
      return;
    }
    $("gpulab-jobs-log-state").textContent = "Following: new output appears here as the job prints it.";
    f.timer = setTimeout(() => readLog(f), more ? 200 : LOG_POLL_MS);
  }

  // ---- the list ------------------------------------------------------------------------------

  async function load() {
    let r;
    try {
      r = await call("GET");
    } catch (e) {
      return; // the hub did not answer: keep the last list
    }
    if (!r.ok) {
      if (r.status === 404) {
        card.classList.add("d-none"); // a hub without jobs
        return;
      }
      say(refusal(r, "Could not read your jobs"), false);
      return;
    }
    const jobs = (Array.isArray(r.data) ? r.data : r.data.jobs || []).slice();
    jobs.sort((a, b) => b.id - a.id);
    $("gpulab-jobs-list").classList.toggle("d-none", jobs.length === 0);
    $("gpulab-jobs-empty").classList.toggle("d-none", jobs.length > 0);
    $("gpulab-jobs-list").querySelector("tbody").replaceChildren(...jobs.map(row));
    const active = jobs.filter((j) => !TERMINAL.includes(j.state)).length;
    $("gpulab-jobs-count").textContent = jobs.length ? active + " active of " + jobs.length : "";
  }

  async function loadTypes() {
    const r = await api("GET", jh.base_url + "api/gpulab/pool");
    const select = $("gpulab-jobs-gpu");
    if (!r.ok) return;
    const options = [];
    for (const t of r.data.gpu_types || []) {
      types[t.slug] = t.display_name;
      if (t.total > 0) {
        options.push(el("option", { value: t.slug }, t.display_name + " (" + t.free + " of " + t.total + " free)"));
      }
    }
    options.push(el("option", { value: "none" }, "No GPU"));
    select.replaceChildren(...options);
    load();
  }

  function spotChanged() {
    const spot = $("gpulab-jobs-pricing").value === "spot";
    $("gpulab-jobs-bid").disabled = !spot;
    if (!spot) $("gpulab-jobs-bid").value = "";
  }

  function gpuChanged() {
    const none = $("gpulab-jobs-gpu").value === "none";
    $("gpulab-jobs-gpus").disabled = none;
    $("gpulab-jobs-nodes").disabled = none;
    $("gpulab-jobs-pricing").disabled = none;
    if (none) {
      $("gpulab-jobs-pricing").value = "on-demand";
      spotChanged();
    }
  }

  $("gpulab-jobs-pricing").addEventListener("change", spotChanged);
  $("gpulab-jobs-gpu").addEventListener("change", gpuChanged);
  $("gpulab-jobs-log-close").addEventListener("click", () => {
    stopFollowing();
    $("gpulab-jobs-log").classList.add("d-none");
  });

  $("gpulab-jobs-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (busy) return;
    const command = $("gpulab-jobs-command").value.trim();
    if (!command) {
      say("Command: what to run from your home, e.g. python train.py.", false);
      return;
    }
    const gpu = $("gpulab-jobs-gpu").value;
    const body = { command, gpu };
    const name = $("gpulab-jobs-name").value.trim();
    if (name) body.name = name;
    if (gpu === "none") {
      body.gpus = 0;
    } else {
      // Numbers as typed: the hub says what is allowed when they are not.
      const gpus = $("gpulab-jobs-gpus").value.trim();
      const nodes = $("gpulab-jobs-nodes").value.trim();
      body.gpus = /^\d+$/.test(gpus) ? Number(gpus) : gpus;
      body.nodes = /^\d+$/.test(nodes) ? Number(nodes) : nodes;
      if ($("gpulab-jobs-pricing").value === "spot") {
        body.pricing = "spot";
        const bid = $("gpulab-jobs-bid").value.trim();
        if (bid) body.max_price = bid;
      }
    }
    busy = true;
    $("gpulab-jobs-submit").disabled = true;
    say("Submitting…", true);
    try {
      const r = await call("POST", "", body);
      if (r.ok) {
        say("Job " + r.data.id + " submitted: " + (r.data.reason || r.data.state) + ".", true);
        $("gpulab-jobs-command").value = "";
        $("gpulab-jobs-name").value = "";
      } else {
        say(refusal(r, "Could not submit the job"), false);
      }
    } finally {
      busy = false;
      $("gpulab-jobs-submit").disabled = false;
    }
    load();
  });

  spotChanged();
  loadTypes();
  setInterval(() => {
    if (document.visibilityState === "visible") load();
  }, LIST_POLL_MS);
})();
