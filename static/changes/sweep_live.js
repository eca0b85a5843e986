// The sweep page's live part. live.js opens /ws/sweeps/<pk>/ (the page's data-live-socket)
// and turns each "sweep.updated" event into an htmx re-fetch of the fragment; this module
// draws the Pareto charts of each fetched fragment (charts.js draws only those of the first
// page load) and shows the state in the tab title, for a sweep watched from another tab.
(function () {
  "use strict";

  function draw(root) {
    if (!window.Plotly) return;
    root.querySelectorAll("[data-chart]").forEach(function (el) {
      if (el.dataset.rendered === "true") return;
      const source = document.getElementById(el.dataset.chart);
      if (!source) return;
      const figure = JSON.parse(source.textContent);
      window.Plotly.newPlot(el, figure.data, figure.layout, { displayModeBar: false, responsive: true })
        .then(function () { el.dataset.rendered = "true"; });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    const root = document.querySelector("[data-sweep][data-live-socket]");
    if (!root) return;
    const title = document.title;
    root.addEventListener("live:sweep.updated", function (event) {
      const data = event.detail || {};
      if (data.state_label) document.title = "(" + data.state_label + ") " + title;
    });
    document.body.addEventListener("htmx:afterSwap", function (event) {
      if (root.contains(event.target)) draw(event.target);
    });
  });
})();
