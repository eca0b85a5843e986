// The run page's live charts. The server embeds the points stored so far; each "run.point"
// event from the run's socket (one a second) extends every chart in place (no redraw), and
// whenever the socket (re)opens the points missed meanwhile are fetched from the stored
// timeline, so a dropped connection leaves no gap. Several browsers can watch one run: each
// has its own socket on the run's group.
(function () {
  "use strict";
  const MAX_SCATTER = 20000; // per-request TTFT markers kept on screen

  function mean(values) {
    const known = values.filter(function (v) { return v !== null && v !== undefined; });
    return known.length ? known.reduce(function (a, b) { return a + b; }, 0) / known.length : null;
  }
  function sum(values) {
    const known = values.filter(function (v) { return v !== null && v !== undefined; });
    return known.length ? known.reduce(function (a, b) { return a + b; }, 0) : null;
  }
  function gpus(p, field, how) { return how((p.gpus || []).map(function (g) { return g[field]; })); }
  function pct(v) { return v === null || v === undefined ? null : v * 100; }

  // Each chart: its traces, and for each trace how a point becomes (x values, y values).
  const CHARTS = {
    ttft: {
      title: "TTFT per request, rolling p50 / p95 (ms)",
      traces: [
        { name: "request", type: "scattergl", mode: "markers", marker: { size: 4, opacity: 0.45 },
          points: function (p) { return [(p.ttfts || []).map(function (s) { return s[0]; }), (p.ttfts || []).map(function (s) { return s[1]; })]; },
          max: MAX_SCATTER },
        { name: "p50", mode: "lines", line: { width: 2 }, points: function (p) { return [[p.t], [p.ttft_p50_ms]]; } },
        { name: "p95", mode: "lines", line: { width: 2, dash: "dot" }, points: function (p) { return [[p.t], [p.ttft_p95_ms]]; } },
      ],
      layout: { yaxis: { title: { text: "ms" }, rangemode: "tozero" } },
    },
    throughput: {
      title: "Output tokens/s and requests/s",
      traces: [
        { name: "output tok/s", mode: "lines", points: function (p) { return [[p.t], [p.output_tokens_per_s]]; } },
        { name: "req/s", mode: "lines", yaxis: "y2", points: function (p) { return [[p.t], [p.requests_per_s]]; } },
      ],
      layout: { yaxis: { title: { text: "tok/s" }, rangemode: "tozero" },
        yaxis2: { title: { text: "req/s" }, overlaying: "y", side: "right", rangemode: "tozero" } },
    },
    concurrency: {
      title: "Requests in flight and the engine's queue",
      traces: [
        { name: "in flight (client)", mode: "lines", points: function (p) { return [[p.t], [p.in_flight]]; } },
        { name: "running (engine)", mode: "lines", points: function (p) { return [[p.t], [p.server_running]]; } },
        { name: "waiting (engine queue)", mode: "lines", points: function (p) { return [[p.t], [p.server_waiting]]; } },
      ],
      layout: { yaxis: { title: { text: "requests" }, rangemode: "tozero" } },
    },
    errors: {
      title: "Errors",
      traces: [
        { name: "errors/s", type: "bar", points: function (p) { return [[p.t], [p.errors_per_s]]; } },
        { name: "failed (total)", mode: "lines", yaxis: "y2", points: function (p) { return [[p.t], [p.failed]]; } },
      ],
      layout: { yaxis: { title: { text: "errors/s" }, rangemode: "tozero" },
        yaxis2: { title: { text: "total" }, overlaying: "y", side: "right", rangemode: "tozero" } },
    },
    kv: {
      title: "KV-cache usage (%)",
      traces: [
        { name: "KV cache", mode: "lines", fill: "tozeroy", points: function (p) { return [[p.t], [pct(p.kv_cache_usage)]]; } },
      ],
      layout: { yaxis: { title: { text: "%" }, range: [0, 100] } },
    },
    gpu: {
      title: "GPU utilisation, memory, power",
      traces: [
        { name: "utilisation % (mean)", mode: "lines", points: function (p) { return [[p.t], [gpus(p, "utilization_pct", mean)]]; } },
        { name: "memory GiB (total)", mode: "lines", yaxis: "y2", points: function (p) { return [[p.t], [gpus(p, "memory_used_gib", sum)]]; } },
        { name: "power W (total)", mode: "lines", yaxis: "y3", points: function (p) { return [[p.t], [gpus(p, "power_w", sum)]]; } },
      ],
      layout: { xaxis: { anchor: "y3", ticksuffix: " s" }, yaxis: { domain: [0.7, 1], title: { text: "util %" }, range: [0, 100] },
        yaxis2: { domain: [0.36, 0.64], title: { text: "GiB" }, rangemode: "tozero" },
        yaxis3: { domain: [0, 0.3], title: { text: "W" }, rangemode: "tozero" } },
    },
  };

  function columns(chart, points) {
    const xs = chart.traces.map(function () { return []; });
    const ys = chart.traces.map(function () { return []; });
    points.forEach(function (p) {
      chart.traces.forEach(function (trace, i) {
        const xy = trace.points(p);
        Array.prototype.push.apply(xs[i], xy[0]);
        Array.prototype.push.apply(ys[i], xy[1]);
      });
    });
    return { x: xs, y: ys };
  }

  function fmtSeconds(s) {
    if (s === null || s === undefined) return "";
    s = Math.round(s);
    const m = Math.floor(s / 60);
    return m ? m + " min " + (s % 60) + " s" : s + " s";
  }

  document.addEventListener("DOMContentLoaded", function () {
    const root = document.querySelector("[data-run]");
    if (!root || !window.Plotly) return;
    const initial = JSON.parse(document.getElementById("run-points").textContent);
    let last = initial.length ? initial[initial.length - 1].t : -1;
    let count = initial.length;
    const elements = {};

    Object.entries(CHARTS).forEach(function ([key, chart]) {
      const el = root.querySelector('[data-run-chart="' + key + '"]');
      if (!el) return;
      elements[key] = el;
      const data = columns(chart, initial);
      const traces = chart.traces.map(function (trace, i) {
        const t = Object.assign({ x: data.x[i], y: data.y[i], name: trace.name }, trace);
        delete t.points; delete t.max;
        return t;
      });
      const layout = Object.assign({
        title: { text: chart.title, font: { size: 13 } },
        margin: { l: 50, r: 50, t: 30, b: 30 }, height: 260,
        legend: { orientation: "h", y: -0.15 },
        xaxis: { ticksuffix: " s" },
      }, chart.layout);
      window.Plotly.newPlot(el, traces, layout, { displayModeBar: false, responsive: true })
        .then(function () { el.dataset.rendered = "true"; el.dataset.points = String(count); });
    });

    function extend(points) {
      const fresh = points.filter(function (p) { return p.t > last; });
      if (!fresh.length) return; // already drawn (a backfill racing a live event)
      Object.entries(CHARTS).forEach(function ([key, chart]) {
        const el = elements[key];
        if (!el) return;
        const data = columns(chart, fresh);
        const indices = chart.traces.map(function (_, i) { return i; });
        const max = chart.traces.map(function (t) { return t.max || 100000; });
        window.Plotly.extendTraces(el, data, indices, Math.max.apply(null, max));
      });
      last = fresh[fresh.length - 1].t;
      count += fresh.length;
      Object.values(elements).forEach(function (el) { el.dataset.points = String(count); });
      progress(fresh[fresh.length - 1]);
    }

    function progress(point) {
      const bar = root.querySelector("[data-progress]");
      if (point.progress !== undefined && point.progress !== null && bar) {
        const percent = Math.round(point.progress * 100);
        bar.style.width = percent + "%";
        bar.parentElement.setAttribute("aria-valuenow", String(percent));
        root.querySelector("[data-progress-text]").textContent = percent + " %";
      }
      const eta = root.querySelector("[data-eta]");
      if (eta) eta.textContent = point.eta_s !== null && point.eta_s !== undefined ? "about " + fmtSeconds(point.eta_s) + " left" : "";
      const now = root.querySelector("[data-now]");
      if (now) {
        now.textContent = fmtSeconds(point.t) + " in · " + point.completed + " done · " + point.failed +
          " failed · stage " + point.stage;
      }
    }

    function status(data) {
      const badge = root.querySelector("[data-run-status]");
      const colours = { queued: "grey", running: "blue", succeeded: "green", failed: "red", cancelled: "amber" };
      if (badge) {
        badge.textContent = data.label;
        badge.dataset.runStatus = data.status;
        badge.className = "badge " + (colours[data.status] || "grey");
      }
      const cancel = root.querySelector("[data-cancel-form]");
      if (cancel && (data.finished || data.cancel_requested)) {
        const button = cancel.querySelector("button");
        button.disabled = true;
        button.textContent = data.finished ? "Finished" : "Cancelling…";
        if (data.finished) cancel.remove();
      }
      if (data.finished) {
        const eta = root.querySelector("[data-eta]");
        if (eta) eta.textContent = "";
        const bar = root.querySelector("[data-progress]");
        if (data.status === "succeeded" && bar) {
          bar.style.width = "100%";
          root.querySelector("[data-progress-text]").textContent = "100 %";
        }
        const state = root.querySelector("[data-live-state]");
        if (state) state.textContent = "finished";
      }
    }

    const live = root.closest("[data-live-socket]") || (root.matches("[data-live-socket]") ? root : null);
    if (!live) return;
    live.addEventListener("live:run.point", function (event) { extend([event.detail]); });
    live.addEventListener("live:run.status", function (event) { status(event.detail); });
    live.addEventListener("live:open", function () {
      fetch(root.dataset.timelineUrl + "?since=" + last, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) { if (data) extend(data.points); });
    });
  });
})();
