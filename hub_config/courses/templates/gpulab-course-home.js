// Courses on the home page (gpulab.hub_config.courses; see gpulab-course-home.html): invitations
// with Accept / Decline, and why cards are held now. Calls carry the page's XSRF token as
// JupyterHub's own pages do (window.jhdata.xsrf_token).
(function () {
  "use strict";
  var jhdata = window.jhdata || {};
  var base = jhdata.base_url || "/hub/";
  var xsrf = jhdata.xsrf_token || "";

  function api(method, path) {
    var url = base + "api/" + path + (path.indexOf("?") === -1 ? "?" : "&") +
      "_xsrf=" + encodeURIComponent(xsrf);
    return fetch(url, {
      method: method,
      credentials: "same-origin",
      cache: "no-store",
      headers: {"X-XSRFToken": xsrf, "Accept": "application/json"}
    }).then(function (r) {
      return r.json().catch(function () { return null; }).then(function (data) {
        return {ok: r.ok, status: r.status, data: data};
      });
    });
  }

  function clock(seconds) {
    return new Date(seconds * 1000).toLocaleTimeString([], {hour: "2-digit", minute: "2-digit", hourCycle: "h23"});
  }

  // ---- invitations -------------------------------------------------------------------------

  function showError(text) {
    var el = document.getElementById("gpulab-invitation-error");
    el.textContent = text;
    el.classList.toggle("d-none", !text);
  }

  function answer(course, verb, item) {
    item.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    showError("");
    api("POST", "gpulab/courses/" + encodeURIComponent(course.name) + "/" + verb).then(function (res) {
      if (!res.ok) {
        showError((res.data && res.data.message) || ("The hub answered " + res.status + "."));
        item.querySelectorAll("button").forEach(function (b) { b.disabled = false; });
        return;
      }
      if (verb === "join") {
        // The course changes what this user may start: the whole page follows.
        window.location.reload();
        return;
      }
      item.remove();
      loadInvitations();
    }, function () {
      showError("The hub did not answer; nothing changed.");
      item.querySelectorAll("button").forEach(function (b) { b.disabled = false; });
    });
  }

  function loadInvitations() {
    var box = document.getElementById("gpulab-invitations");
    var list = document.getElementById("gpulab-invitation-list");
    var template = document.getElementById("gpulab-invitation-row");
    return api("GET", "gpulab/courses").then(function (res) {
      var invited = ((res.ok && res.data && res.data.courses) || []).filter(function (c) {
        return c.role === "invited";
      });
      list.textContent = "";
      invited.forEach(function (c) {
        var item = template.content.firstElementChild.cloneNode(true);
        item.dataset.course = c.name;
        item.querySelector(".gpulab-invitation-title").textContent = c.display_name || c.name;
        item.querySelector(".gpulab-invitation-name").textContent = "(" + c.name + ")";
        if (c.invited_as === "ta") {
          // A TA may open, start and stop the course's students' servers, on its pool.
          item.querySelector(".gpulab-invitation-role").textContent = "TA";
          item.querySelector(".gpulab-invitation-what").textContent =
            "As a TA you will be able to open, start and stop its students' servers.";
        }
        item.querySelector(".gpulab-invitation-accept").addEventListener("click", function () {
          answer(c, "join", item);
        });
        item.querySelector(".gpulab-invitation-decline").addEventListener("click", function () {
          answer(c, "decline", item);
        });
        list.appendChild(item);
      });
      box.classList.toggle("d-none", invited.length === 0);
    }, function () {});
  }

  // ---- cards held now ------------------------------------------------------------------------

  function loadHeld() {
    var table = document.getElementById("gpulab-pool");
    if (!table) return;
    var note = document.getElementById("gpulab-held-now");
    if (!note) {
      note = document.createElement("ul");
      note.id = "gpulab-held-now";
      note.className = "small text-body-secondary list-unstyled";
      table.parentNode.insertBefore(note, table.nextSibling);
    }
    api("GET", "gpulab/pool").then(function (res) {
      var held = (res.ok && res.data && res.data.held_now) || [];
      note.textContent = "";
      held.forEach(function (h) {
        var li = document.createElement("li");
        li.textContent = h.cards + " " + h.gpu_type + " card" + (h.cards === 1 ? "" : "s") +
          " held for " + h["for"] + " " + clock(h.start) + "\u2013" + clock(h.end) +
          ": not counted as free.";
        note.appendChild(li);
      });
    }, function () {});
  }

  function start() {
    loadInvitations();
    loadHeld();
    setInterval(loadHeld, 15000);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
