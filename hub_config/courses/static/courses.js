// The course list page's "Create a course" form (admins), inlined by
// gpulab.hub_config.courses.dashboard. It posts to POST api/gpulab/courses with the page's XSRF
// token (window.jhdata.xsrf_token, as JupyterHub's own pages do), then opens the new course's
// dashboard. An error (400 naming the field, e.g. a teacher who is not a user of the hub) is shown
// in plain words and marks the field; nothing is created. Text only, never HTML from strings.
(function () {
  "use strict";
  var form = document.getElementById("gpulab-new-course-form");
  if (!form) return;
  var jhdata = window.jhdata || {};
  var base = jhdata.base_url || "/hub/";
  var xsrf = jhdata.xsrf_token || "";
  var error = document.getElementById("gpulab-new-course-error");
  var button = document.getElementById("gpulab-create-course");
  // The API's field -> the form's input.
  var INPUTS = {
    name: "gpulab-course-name",
    display_name: "gpulab-course-title",
    teachers: "gpulab-course-teacher",
    tas: "gpulab-course-tas"
  };
  // The API's field -> what the form calls it.
  var LABELS = {name: "Course name", display_name: "Display name", teachers: "Teacher",
    tas: "TAs", "limits.gpu_types": "GPU types"};

  function names(text) {
    return text.split(",").map(function (s) { return s.trim(); }).filter(Boolean);
  }

  function showError(field, message) {
    Object.keys(INPUTS).forEach(function (k) {
      document.getElementById(INPUTS[k]).classList.toggle("is-invalid", k === field);
    });
    var label = LABELS[field] || field;
    error.textContent = message ? (label ? label + ": " : "") + message : "";
    error.classList.toggle("d-none", !message);
  }

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    showError("", "");
    var teacher = document.getElementById("gpulab-course-teacher").value.trim();
    var name = document.getElementById("gpulab-course-name").value.trim();
    if (!name) { showError("name", "give the course a name, e.g. ml101"); return; }
    if (!teacher) { showError("teachers", "choose the course's teacher from the hub's users"); return; }
    var gpus = Array.prototype.map.call(
      form.querySelectorAll("input[name=gpu_types]:checked"), function (el) { return el.value; });
    if (!gpus.length) { showError("limits.gpu_types", "tick at least one"); return; }
    var body = {
      name: name,
      display_name: document.getElementById("gpulab-course-title").value.trim(),
      teachers: [teacher],
      tas: names(document.getElementById("gpulab-course-tas").value),
      limits: {gpu_types: gpus}
    };
    button.disabled = true;
    var url = base + "api/gpulab/courses?_xsrf=" + encodeURIComponent(xsrf);
    fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-XSRFToken": xsrf, "Accept": "application/json"},
      body: JSON.stringify(body)
    }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (data) {
        if (r.ok) {
          window.location.assign(base + "gpulab/courses/" + encodeURIComponent(data.name || name));
          return;
        }
        var message = data.message || ("the hub answered " + r.status);
        var field = data.field || "";
        if (field && message.indexOf(field + ": ") === 0) message = message.slice(field.length + 2);
        showError(field, message.replace(/[.!]?$/, ".") + " Nothing was created.");
      });
    }, function () {
      showError("", "The hub did not answer; nothing was created.");
    }).then(function () { button.disabled = false; });
  });
})();
