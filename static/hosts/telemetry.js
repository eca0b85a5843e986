// Live GPU telemetry on the host page: one plotly figure per GPU (utilisation, memory, power
// stacked on one time axis), drawn from the samples the server embedded, extended in place
// with every "telemetry" event from the host's socket (no redraw), and backfilled from the
// stored samples whenever the socket (re)opens, so a dropped connection leaves no gap.
(function () {
  "use strict";
  const MAX_POINTS = 600; // ten minutes at one sample a second

  document.addEventListener("DOMContentLoaded", function () {
    const root = document.querySelector("[data-telemetry]");
    if (!root || !window.Plotly) return;
    const live = root.closest("[data-live-socket]");
    const initial = JSON.parse(document.getElementById(root.dataset.telemetry).textContent);
    const charts = {};

    function layout(series) {
      return {
        title: { text: "GPU" + series.index + " · " + series.name, font: { size: 13 } },
        margin: { l: 50, r: 10, t: 30, b: 30 },
        height: 300,
        showlegend: false,
        xaxis: { type: "date", anchor: "y3" },
        yaxis: { domain: [0.7, 1], title: { text: "util %" }, range: [0, 100] },
        yaxis2: { domain: [0.36, 0.64], title: { text: "mem GiB" }, range: [0, series.memory_total_gib] },
        yaxis3: { domain: [0, 0.3], title: { text: "power W" }, rangemode: "tozero" },
      };
    }

    Object.entries(initial.gpus).forEach(function ([pk, s]) {
      const el = root.querySelector('[data-gpu-chart="' + pk + '"]');
      if (!el) return;
      const traces = [
        { x: s.t, y: s.utilization, yaxis: "y", name: "utilisation %", mode: "lines" },
        { x: s.t, y: s.memory_gib, yaxis: "y2", name: "memory GiB", mode: "lines" },
        { x: s.t, y: s.power_w, yaxis: "y3", name: "power W", mode: "lines" },
      ];
      charts[pk] = { el: el, last: s.t.length ? s.t[s.t.length - 1] : 0, points: s.t.length };
      window.Plotly.newPlot(el, traces, layout(s), { displayModeBar: false, responsive: true })
        .then(function () { el.dataset.rendered = "true"; el.dataset.points = String(s.t.length); });
    });

    function extend(pk, ts, util, mem, power) {
      const chart = charts[pk];
      if (!chart) return;
      const keep = [];
      ts.forEach(function (t, i) { if (t > chart.last) keep.push(i); });
      if (!keep.length) return; // already drawn (a backfill racing a live event)
      const pick = function (arr) { return keep.map(function (i) { return arr[i]; }); };
      const x = pick(ts);
      window.Plotly.extendTraces(chart.el, { x: [x, x, x], y: [pick(util), pick(mem), pick(power)] }, [0, 1, 2], MAX_POINTS);
      chart.last = x[x.length - 1];
      chart.points += x.length;
      chart.el.dataset.points = String(chart.points);
    }

    function showNow(point) {
      const row = document.querySelector('[data-gpu-now="' + point.gpu + '"]');
      if (!row) return;
      const set = function (field, text) {
        const cell = row.querySelector('[data-field="' + field + '"]');
        if (cell) cell.textContent = text;
      };
      const fmt = function (v, digits, unit) { return v === null || v === undefined ? "—" : Number(v).toFixed(digits) + (unit || ""); };
      set("utilization_pct", fmt(point.utilization_pct, 0, " %"));
      set("memory_used_gib", fmt(point.memory_used_gib, 1));
      set("power_w", fmt(point.power_w, 0));
      set("temperature_c", fmt(point.temperature_c, 0));
      set("sm_clock_mhz", fmt(point.sm_clock_mhz, 0));
      set("throttle_reasons", point.throttle_reasons && point.throttle_reasons.length ? point.throttle_reasons.join(", ") : "none");
    }

    live.addEventListener("live:telemetry", function (event) {
      const data = event.detail;
      data.gpus.forEach(function (p) {
        extend(String(p.gpu), [data.t], [p.utilization_pct], [p.memory_used_gib], [p.power_w]);
        showNow(p);
      });
    });

    live.addEventListener("live:open", function () {
      const since = Math.min.apply(null, Object.values(charts).map(function (c) { return c.last; }).concat([Date.now()]));
      fetch(root.dataset.backfillUrl + "?since=" + since, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) {
          if (!data) return;
          Object.entries(data.gpus).forEach(function ([pk, s]) { extend(pk, s.t, s.utilization, s.memory_gib, s.power_w); });
        });
    });
  });
})();
