// The course dashboard's behaviour, inlined into its page by gpulab.hub_config.courses.dashboard.
// It only changes text, attributes and classes (cloning the page's <template> rows), never builds
// HTML from strings. Calls go to the hub's JSON API with the page's XSRF token, as JupyterHub's
// own pages do (window.jhdata.xsrf_token as the _xsrf parameter and the X-XSRFToken header):
//   GET    api/gpulab/courses/C            every few seconds: roster and students' servers
//   POST   api/gpulab/courses/C/roster     the roster CSV (teachers)
//   DELETE api/users/NAME/server           Stop
//   POST   api/users/NAME/server           Restart, naming the course ({"course": C, ...})
//   GET    api/gpulab/courses/C/bookings   the lab-session bookings
//   POST   api/gpulab/courses/C/bookings   book one (teachers and admins)
//   DELETE api/gpulab/courses/C/bookings/ID  cancel one, after the browser's confirmation
(function () {
  "use strict";
  var root = document.getElementById("gpulab-course");
  if (!root) return;
  var jhdata = window.jhdata || {};
  var base = jhdata.base_url || "/hub/";
  var xsrf = jhdata.xsrf_token || "";
  var course = root.dataset.course;
  var refreshMs = parseInt(root.dataset.refreshMs, 10) || 3000;
  var coursePath = "gpulab/courses/" + encodeURIComponent(course);
  var NONE = "\u2014";
  // The course API's server states: the label and the badge (as dashboard.STATE_LABELS).
  var STATES = {
    ready: ["running", "text-bg-success"],
    starting: ["starting", "text-bg-warning"],
    spawn: ["starting", "text-bg-warning"],
    stop: ["stopping", "text-bg-secondary"],
    stopped: ["stopped", "text-bg-light border"]
  };
  // What a restart keeps of the options the student's server last ran with.
  var KEPT_OPTIONS = ["app", "image", "gpu", "gpus", "datasets"];
  var lastOptions = {};

  var tbody = document.querySelector("#gpulab-students tbody");
  var rowTemplate = document.getElementById("gpulab-student-row");
  var noStudents = document.getElementById("gpulab-no-students");
  var refreshed = document.getElementById("gpulab-refreshed");

  // ``body``: an object sent as JSON, or a Blob sent as it is. JupyterHub refuses a
  // cookie-authenticated POST whose Content-Type is not JSON (what a cross-site form could send),
  // but takes one without any: a Blob of no type, as the roster CSV goes.
  function api(method, path, body) {
    var url = base + "api/" + path;
    url += (url.indexOf("?") === -1 ? "?" : "&") + "_xsrf=" + encodeURIComponent(xsrf);
    var headers = {"X-XSRFToken": xsrf, "Accept": "application/json"};
    var init = {method: method, headers: headers, credentials: "same-origin", cache: "no-store"};
    if (body instanceof Blob) {
      init.body = body;
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(url, init).then(function (r) {
      return r.text().then(function (text) {
        var data = null;
        try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
        return {ok: r.ok, status: r.status, data: data};
      });
    });
  }

  function errorText(res) {
    var d = res.data || {};
    var message = d.message || ("HTTP " + res.status);
    if (d.field && message.indexOf(d.field) !== 0) message = d.field + ": " + message;
    return message;
  }

  function sleep(ms) {
    return new Promise(function (resolve) { setTimeout(resolve, ms); });
  }

  // ---- roster and servers ------------------------------------------------------------------

  function rowFor(name) {
    var rows = tbody.querySelectorAll("tr[data-student]");
    for (var i = 0; i < rows.length; i++) {
      if (rows[i].dataset.student === name) return rows[i];
    }
    return null;
  }

  function newRow(name) {
    var tr = rowTemplate.content.querySelector("tr").cloneNode(true);
    tr.dataset.student = name;
    tr.querySelector(".gpulab-name").textContent = name;
    wire(tr);
    return tr;
  }

  function setText(tr, selector, text) {
    tr.querySelector(selector).textContent = text;
  }

  function showServer(tr, s) {
    var state = s.state || "stopped";
    var look = STATES[state] || [state, "text-bg-light border"];
    tr.dataset.state = state;
    var badge = tr.querySelector(".gpulab-state");
    badge.className = "badge gpulab-state " + look[1];
    badge.textContent = look[0];
    setText(tr, ".gpulab-mode", s.mode || (state === "stopped" ? NONE : ""));
    setText(tr, ".gpulab-gpu",
      s.gpu_type && s.gpu_type !== "none" ? s.gpu_type + " \u00d7 " + (s.cards || 0) : NONE);
    setText(tr, ".gpulab-server-course", s.course || NONE);
    var open = tr.querySelector(".gpulab-open");
    if (state === "ready" && s.url) {
      open.setAttribute("href", s.url);
      open.classList.remove("d-none");
    } else {
      open.classList.add("d-none");
    }
    showBusy(tr);
  }

  function showBusy(tr) {
    var busy = tr.dataset.busy === "1";
    tr.querySelector(".gpulab-stop").disabled = busy || tr.dataset.state === "stopped";
    tr.querySelector(".gpulab-restart").disabled = busy;
  }

  function setPeople(id, names) {
    document.getElementById(id).textContent = names && names.length ? names.join(", ") : NONE;
  }

  function showCourse(c) {
    var students = c.students || [];
    var servers = c.servers || {};
    setPeople("gpulab-teachers", c.teachers);
    setPeople("gpulab-tas", c.tas);
    setPeople("gpulab-student-names", students);
    document.getElementById("gpulab-student-count").textContent = String(students.length);
    Array.prototype.forEach.call(tbody.querySelectorAll("tr[data-student]"), function (tr) {
      if (students.indexOf(tr.dataset.student) === -1) tr.remove();
    });
    students.forEach(function (name, i) {
      var tr = rowFor(name) || newRow(name);
      if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
      if (servers[name]) showServer(tr, servers[name]);
    });
    noStudents.classList.toggle("d-none", students.length > 0);
  }

  // The course as the API has it now (and shown), or null.
  function refresh() {
    return api("GET", coursePath).then(function (res) {
      if (!res.ok || !res.data) {
        refreshed.textContent = "could not refresh: " + errorText(res);
        return null;
      }
      showCourse(res.data);
      refreshed.textContent = "updated " + new Date().toLocaleTimeString();
      return res.data;
    }, function () {
      refreshed.textContent = "could not refresh (hub unreachable)";
      return null;
    });
  }

  function poll() {
    refresh().then(function () { setTimeout(poll, refreshMs); });
  }

  // Until the student's server is in one of ``states``; rejects after ``seconds``.
  function waitFor(name, states, seconds) {
    var deadline = Date.now() + seconds * 1000;
    function check() {
      return refresh().then(function (c) {
        var s = c && c.servers && c.servers[name];
        if (s && states.indexOf(s.state) !== -1) return s;
        if (Date.now() > deadline) {
          throw new Error("still " + (s ? s.state : "unknown") + " after " + seconds + " s");
        }
        return sleep(1000).then(check);
      });
    }
    return check();
  }

  // ---- actions -----------------------------------------------------------------------------

  function say(tr, text, bad) {
    var el = tr.querySelector(".gpulab-row-message");
    el.textContent = text;
    el.classList.toggle("text-danger", !!bad);
    el.classList.toggle("text-body-secondary", !bad);
  }

  function setBusy(tr, busy) {
    tr.dataset.busy = busy ? "1" : "";
    showBusy(tr);
  }

  function serverPath(name) {
    return "users/" + encodeURIComponent(name) + "/server";
  }

  // Keep what the running server was started with, for a later Restart.
  function rememberOptions(name) {
    return api("GET", "users/" + encodeURIComponent(name)).then(function (res) {
      var s = res.ok && res.data && res.data.servers && res.data.servers[""];
      if (!s || !s.user_options) return;
      var kept = {};
      KEPT_OPTIONS.forEach(function (k) {
        if (s.user_options[k] !== undefined && s.user_options[k] !== null) kept[k] = s.user_options[k];
      });
      lastOptions[name] = kept;
    }, function () {});
  }

  function stopServer(name) {
    return rememberOptions(name).then(function () {
      return api("DELETE", serverPath(name));
    }).then(function (res) {
      if (!res.ok && res.status !== 404) throw new Error(errorText(res));
      return waitFor(name, ["stopped"], 120);
    });
  }

  function run(tr, start, work) {
    setBusy(tr, true);
    say(tr, start);
    work().then(function () {
      say(tr, "");
    }, function (e) {
      say(tr, e.message || String(e), true);
    }).then(function () {
      setBusy(tr, false);
    });
  }

  function stop(tr) {
    var name = tr.dataset.student;
    run(tr, "stopping\u2026", function () { return stopServer(name); });
  }

  function restart(tr) {
    var name = tr.dataset.student;
    run(tr, "restarting\u2026", function () {
      var first = tr.dataset.state === "stopped" ? Promise.resolve() : stopServer(name);
      return first.then(function () {
        var options = Object.assign({}, lastOptions[name] || {}, {course: course});
        return api("POST", serverPath(name), options);
      }).then(function (res) {
        if (!res.ok) throw new Error(errorText(res));
        if (res.data && res.data.queued) {
          say(tr, res.data.message || "queued");
          return null;
        }
        say(tr, "starting\u2026");
        return waitFor(name, ["ready"], 180);
      });
    });
  }

  function wire(tr) {
    tr.querySelector(".gpulab-stop").addEventListener("click", function () { stop(tr); });
    tr.querySelector(".gpulab-restart").addEventListener("click", function () { restart(tr); });
  }

  Array.prototype.forEach.call(tbody.querySelectorAll("tr[data-student]"), wire);

  // ---- roster upload (teachers) ------------------------------------------------------------

  var form = document.getElementById("gpulab-roster-form");
  if (form) {
    var fileInput = document.getElementById("gpulab-roster-file");
    var upload = document.getElementById("gpulab-roster-upload");
    var bad = document.getElementById("gpulab-roster-error");
    var ok = document.getElementById("gpulab-roster-ok");
    var show = function (el, text) {
      el.textContent = text;
      el.classList.toggle("d-none", !text);
    };
    var reportTable = document.getElementById("gpulab-roster-report");
    var showReport = function (report) {
      var body = reportTable.querySelector("tbody");
      body.textContent = "";
      report.forEach(function (r) {
        var tr = document.createElement("tr");
        tr.dataset.username = r.username;
        tr.dataset.outcome = r.outcome;
        [String(r.line), r.username, r.role, r.message].forEach(function (text) {
          var td = document.createElement("td");
          td.textContent = text;
          tr.appendChild(td);
        });
        body.appendChild(tr);
      });
      reportTable.classList.toggle("d-none", !report.length);
    };
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      show(bad, "");
      show(ok, "");
      showReport([]);
      var file = fileInput.files[0];
      if (!file) {
        show(bad, "Choose a roster CSV file first.");
        return;
      }
      upload.disabled = true;
      file.arrayBuffer().then(function (bytes) {
        return api("POST", coursePath + "/roster", new Blob([bytes]));
      }).then(function (res) {
        if (!res.ok) {
          show(bad, "Nothing changed. " + errorText(res));
          return null;
        }
        var report = (res.data && res.data.report) || [];
        var invited = report.filter(function (r) { return r.outcome === "invited"; }).length;
        show(ok, "Imported " + res.data.rows + (res.data.rows === 1 ? " row" : " rows") +
          (invited ? "; " + invited + " existing user" + (invited === 1 ? " was" : "s were") +
            " invited and join once they accept" : "") + ". Each row's result is below.");
        showReport(report);
        form.reset();
        return refresh();
      }).catch(function (e) {
        show(bad, "Nothing changed. " + (e.message || String(e)));
      }).then(function () {
        upload.disabled = false;
      });
    });
  }

  // ---- bookings ----------------------------------------------------------------------------

  function when(text) {
    var d = new Date(text);
    return isNaN(d.getTime()) ? String(text || NONE) : d.toLocaleString();
  }

  function showAlert(id, text) {
    var el = document.getElementById(id);
    if (!el) return;
    el.textContent = text;
    el.classList.toggle("d-none", !text);
  }

  function cancelBooking(b, button) {
    var question = "Cancel the lab session of " + when(b.start) + " (" + b.cards + " \u00d7 " +
      b.gpu_type + ")? Its cards go back to everyone; servers already running keep going.";
    if (!window.confirm(question)) return;
    button.disabled = true;
    showAlert("gpulab-bookings-error", "");
    api("DELETE", coursePath + "/bookings/" + encodeURIComponent(b.id)).then(function (res) {
      if (!res.ok) showAlert("gpulab-bookings-error", "Not cancelled. " + errorText(res));
      loadBookings();
    }, function () {
      showAlert("gpulab-bookings-error", "Not cancelled: the hub did not answer.");
      button.disabled = false;
    });
  }

  function loadBookings() {
    var table = document.getElementById("gpulab-bookings");
    var none = document.getElementById("gpulab-no-bookings");
    var template = document.getElementById("gpulab-booking-row");
    return api("GET", coursePath + "/bookings").then(function (res) {
      var list = null;
      if (res.ok && res.data && Array.isArray(res.data.bookings)) list = res.data.bookings;
      var body = table.querySelector("tbody");
      body.textContent = "";
      (list || []).forEach(function (b) {
        var tr = template.content.querySelector("tr").cloneNode(true);
        setText(tr, ".gpulab-booking-start", when(b.start));
        setText(tr, ".gpulab-booking-end", when(b.end));
        setText(tr, ".gpulab-booking-gpu", b.gpu_type || NONE);
        setText(tr, ".gpulab-booking-cards", String(b.cards === undefined ? NONE : b.cards));
        setText(tr, ".gpulab-booking-state", b.state || NONE);
        tr.dataset.booking = String(b.id);
        var cancel = tr.querySelector(".gpulab-booking-cancel");
        if (cancel) cancel.addEventListener("click", function () { cancelBooking(b, cancel); });
        body.appendChild(tr);
      });
      var any = !!(list && list.length);
      table.classList.toggle("d-none", !any);
      none.classList.toggle("d-none", any);
    }, function () {});
  }

  // ---- booking form (teachers) -------------------------------------------------------------

  var bookingForm = document.getElementById("gpulab-booking-form");
  if (bookingForm) {
    // The field the API names -> the form's input.
    var BOOKING_INPUTS = {gpu_type: "gpulab-booking-gpu", cards: "gpulab-booking-cards",
      start: "gpulab-booking-start", minutes: "gpulab-booking-minutes", end: "gpulab-booking-minutes"};
    var BOOKING_LABELS = {gpu_type: "GPU type", cards: "Cards", start: "Starts",
      minutes: "Minutes", end: "Minutes"};
    var bookingError = function (field, text) {
      Object.keys(BOOKING_INPUTS).forEach(function (k) {
        document.getElementById(BOOKING_INPUTS[k]).classList.toggle("is-invalid", !!text && k === field);
      });
      var label = BOOKING_LABELS[field];
      showAlert("gpulab-booking-error", text ? (label ? label + ": " : "") + text : "");
    };
    bookingForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      bookingError("", "");
      showAlert("gpulab-booking-ok", "");
      var startText = document.getElementById("gpulab-booking-start").value;
      var start = new Date(startText);  // datetime-local: the browser's own time zone
      if (!startText || isNaN(start.getTime())) {
        bookingError("start", "choose the day and time the class starts");
        return;
      }
      var cards = Number(document.getElementById("gpulab-booking-cards").value);
      var minutes = Number(document.getElementById("gpulab-booking-minutes").value);
      if (!Number.isInteger(cards) || cards < 1) {
        bookingError("cards", "a whole number of at least 1");
        return;
      }
      if (!(minutes > 0)) {
        bookingError("minutes", "a positive number of minutes");
        return;
      }
      var submit = document.getElementById("gpulab-booking-submit");
      submit.disabled = true;
      api("POST", coursePath + "/bookings", {
        gpu_type: document.getElementById("gpulab-booking-gpu").value,
        cards: cards,
        start: start.toISOString().replace(/\.\d{3}Z$/, "Z"),
        minutes: minutes
      }).then(function (res) {
        if (!res.ok) {
          var d = res.data || {};
          var message = d.message || ("the hub answered " + res.status);
          if (d.field && message.indexOf(d.field + ": ") === 0) message = message.slice(d.field.length + 2);
          bookingError(d.field || "", message.replace(/[.!]?$/, ".") + " Nothing was booked.");
          return null;
        }
        showAlert("gpulab-booking-ok", "Booked " + res.data.cards + " \u00d7 " + res.data.gpu_type +
          " from " + when(res.data.start) + " to " + when(res.data.end) + ".");
        return loadBookings();
      }, function () {
        bookingError("", "The hub did not answer; nothing was booked.");
      }).then(function () { submit.disabled = false; });
    });
  }

  poll();
  loadBookings();
})();
