// The spawn form's behaviour, inlined into the form by gpulab.spawners.form (JupyterHub injects
// the form into its spawn page, so no extra route serves it). It refreshes the free counts from
// GET api/gpulab/pool, the spot prices from api/gpulab/spot/prices, and this server's queued
// request (place, price; Cancel sends DELETE api/gpulab/spot/queue/USER).
(function () {
  var base = (window.jhdata && window.jhdata.base_url) || "/hub/";
  var xsrf = (window.jhdata && window.jhdata.xsrf_token) || "";
  function refresh() {
    fetch(base + "api/gpulab/pool", {headers: {"X-XSRFToken": xsrf}, credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (pool) {
        if (!pool) return;
        pool.gpu_types.forEach(function (t) {
          var el = document.querySelector('[data-gpu-free="' + t.slug + '"]');
          if (el) el.textContent = t.free + "/" + t.total + " free";
          var row = document.querySelector('[data-gpu-row="' + t.slug + '"]');
          if (row) row.classList.toggle("full", t.free === 0);
        });
      }).catch(function () {});
  }
  function refreshSpot() {
    fetch(base + "api/gpulab/spot/prices?hours=1", {headers: {"X-XSRFToken": xsrf}, credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (prices) {
        if (!prices) return;
        prices.gpu_types.forEach(function (t) {
          var el = document.querySelector('[data-gpu-spot="' + t.slug + '"]');
          if (el) el.textContent = t.price;
        });
      }).catch(function () {});
  }
  var queued = document.getElementById("gpulab-queued");
  function queueUrl() {
    var server = queued.dataset.server;
    return base + "api/gpulab/spot/queue/" + encodeURIComponent(queued.dataset.user) +
      (server ? "?server=" + encodeURIComponent(server) : "");
  }
  function queueSay(text) {
    document.getElementById("gpulab-queue-state").textContent = text;
  }
  function refreshQueue() {
    if (!queued || queued.dataset.done) return;
    fetch(base + "api/gpulab/spot/queue", {headers: {"X-XSRFToken": xsrf}, credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (answer) {
        if (!answer) return;
        var mine = answer.queue.filter(function (q) { return q.id === queued.dataset.id; })[0];
        if (!mine) {
          queued.dataset.done = "gone";
          queueSay("No longer queued: it has started (or was cancelled). Reload this page.");
          document.getElementById("gpulab-queue-cancel").disabled = true;
          return;
        }
        document.getElementById("gpulab-queue-position").textContent = mine.position;
        document.getElementById("gpulab-queue-length").textContent = mine.queue_length;
        document.getElementById("gpulab-queue-price").textContent = mine.current_price;
      }).catch(function () {});
  }
  if (queued) {
    document.getElementById("gpulab-queue-cancel").addEventListener("click", function () {
      this.disabled = true;
      fetch(queueUrl(), {method: "DELETE", headers: {"X-XSRFToken": xsrf}, credentials: "same-origin"})
        .then(function (r) {
          return r.json().then(function (body) { return {ok: r.ok, body: body}; });
        })
        .then(function (answer) {
          if (answer.ok) {
            queued.dataset.done = "cancelled";
            queueSay("Cancelled: request " + answer.body.cancelled + " left the queue. " +
              "Nothing is held or charged.");
          } else {
            document.getElementById("gpulab-queue-cancel").disabled = false;
            queueSay("Could not cancel: " + (answer.body.message || "error"));
          }
        }).catch(function (e) {
          document.getElementById("gpulab-queue-cancel").disabled = false;
          queueSay("Could not cancel: " + e);
        });
    });
  }
  setInterval(refresh, 5000);
  setInterval(refreshSpot, 10000);
  setInterval(refreshQueue, 5000);
  var pricing = document.querySelectorAll('input[name="pricing"]');
  function togglePrice() {
    var spot = document.querySelector('input[name="pricing"]:checked');
    document.getElementById("gpulab-max-price").disabled = !(spot && spot.value === "spot");
  }
  pricing.forEach(function (el) { el.addEventListener("change", togglePrice); });
  togglePrice();
  // Cards mean nothing in no-GPU mode (the hub ignores them there): grey the field out.
  function toggleCards() {
    var gpu = document.querySelector('input[name="gpu"]:checked');
    document.querySelector('input[name="gpus"]').disabled = !!(gpu && gpu.value === "none");
  }
  document.querySelectorAll('input[name="gpu"]').forEach(function (el) {
    el.addEventListener("change", toggleCards);
  });
  toggleCards();
})();
