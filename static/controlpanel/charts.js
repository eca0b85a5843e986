// Draw every <div data-chart="ID"> with the plotly figure the server put in <script id="ID">.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-chart]").forEach(function (el) {
      const source = document.getElementById(el.dataset.chart);
      if (!source || !window.Plotly) return;
      const figure = JSON.parse(source.textContent);
      window.Plotly.newPlot(el, figure.data, figure.layout, { displayModeBar: false, responsive: true })
        .then(function () { el.dataset.rendered = "true"; });
    });
  });
})();
