// The run page's live charts. The server embeds the points stored so far; each "run.point"
// event from the run's socket (one a second) extends every chart in place (no redraw), and
// whenever the socket (re)opens the points missed meanwhile are fetched from the stored
// timeline, so a dropped connection leaves no gap. Points are merged by their t: a live point
// that beats the backfill's reply does not make the missed seconds look "already drawn". The
// backfill's reply also carries the run's status, so a run that ended while the socket was
// down shows as ended. Several browsers can watch one run: each has its own socket.
(function () {
  "use strict";
  const MAX_SCATTER = 20000; // per-request TTFT markers kept on screen
  const MAX_LINE = 100000; // points kept per line (a 3-hour run is 10,800 of them)

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

  // Two series sorted by x merged into one (the line traces: one x per point, its t).
  function mergeSorted(x1, y1, x2, y2) {
    const x = [], y = [];
    let i = 0, j = 0;
    while (i < x1.length || j < x2.length) {
      if (j >= x2.length || (i < x1.length && x1[i] <= x2[j])) { x.push(x1[i]); y.push(y1[i]); i++; }
      else { x.push(x2[j]); y.push(y2[j]); j++; }
    }
    return { x: x, y: y };
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
    const drawn = new Set(initial.map(function (p) { return p.t; })); // t of every point shown
    let last = initial.length ? initial[initial.length - 1].t : -1;
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
        .then(function () { el.dataset.rendered = "true"; el.dataset.points = String(drawn.size); });
    });

    function extend(points) {
      const fresh = [];
      points.forEach(function (p) {
        if (drawn.has(p.t)) return; // already drawn (a backfill racing a live event)
        drawn.add(p.t);
        fresh.push(p);
      });
      if (!fresh.length) return;
      fresh.sort(function (a, b) { return a.t - b.t; });
      // The ordinary case, every point newer than the charts: extend in place. Otherwise (a
      // backfill whose seconds are older than a live point already drawn) each trace is
      // rebuilt once from its merged series, still on the same plot.
      const appending = fresh[0].t > last;
      Object.entries(CHARTS).forEach(function ([key, chart]) {
        const el = elements[key];
        if (!el) return;
        const data = columns(chart, fresh);
        const indices = chart.traces.map(function (_, i) { return i; });
        const caps = chart.traces.map(function (t) { return t.max || MAX_LINE; });
        if (appending) {
          // Per-trace caps (plotly takes {attribute: [cap per trace]}): one call, one redraw.
          window.Plotly.extendTraces(el, data, indices, { x: caps, y: caps });
          return;
        }
        const merged = chart.traces.map(function (trace, i) {
          const old = el.data[i];
          // Markers need no order; lines do.
          const m = trace.max ? { x: old.x.concat(data.x[i]), y: old.y.concat(data.y[i]) }
            : mergeSorted(old.x, old.y, data.x[i], data.y[i]);
          return { x: m.x.slice(-caps[i]), y: m.y.slice(-caps[i]) };
        });
        window.Plotly.restyle(el, {
          x: merged.map(function (m) { return m.x; }), y: merged.map(function (m) { return m.y; }),
        }, indices);
      });
      Object.values(elements).forEach(function (el) { el.dataset.points = String(drawn.size); });
      const newest = fresh[fresh.length - 1];
      if (newest.t > last) {
        last = newest.t;
        progress(newest);
      }
    }

    function known(v) { return v !== null && v !== undefined; }

    function setProgress(fraction) {
      const bar = root.querySelector("[data-progress]");
      if (!known(fraction) || !bar) return;
      const percent = Math.round(fraction * 100);
      bar.style.width = percent + "%";
      bar.parentElement.setAttribute("aria-valuenow", String(percent));
      root.querySelector("[data-progress-text]").textContent = percent + " %";
    }

    function progress(point) {
      // A backfilled old point has only the charts' numbers: the line shows the newest whole one.
      if (!known(point.completed)) return;
      setProgress(point.progress);
      const eta = root.querySelector("[data-eta]");
      // The server's estimate (the plan's schedule and the observed completion rate); none
      // during the warm-up, which no plan times, or before the rate has been seen long enough.
      if (eta) {
        eta.textContent = known(point.eta_s) ? "about " + fmtSeconds(point.eta_s) + " left"
          : point.stage === "warmup" ? "warming up…" : "estimating…";
      }
      const now = root.querySelector("[data-now]");
      if (now) {
        now.textContent = fmtSeconds(point.t) + " in · " + point.completed + " done · " + point.failed +
          " failed · stage " + point.stage;
      }
    }

    function status(data) {
      const badge = root.querySelector("[data-run-status]");
      if (badge) {
        badge.textContent = data.label;
        badge.dataset.runStatus = data.status;
        // The colour comes with the event, from the status's choice (one definition).
        badge.className = "badge " + (data.colour || "grey");
        badge.title = data.title || "";
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
        if (data.status === "succeeded") setProgress(1);
        const state = root.querySelector("[data-live-state]");
        if (state) state.textContent = "finished";
      }
    }

    // The status as the backfill saw it: a change the socket missed is applied as the
    // "run.status" event would have (badge, progress, and htmx re-fetching the fragments).
    // A run's end is final: the backfill's reply may have been computed before the run ended
    // while the socket's "succeeded" got here first, and must not set the badge back.
    const FINISHED = ["succeeded", "failed", "cancelled"];

    function caughtUp(data) {
      const badge = root.querySelector("[data-run-status]");
      const stale = badge && FINISHED.indexOf(badge.dataset.runStatus) >= 0 &&
        FINISHED.indexOf(data.status) < 0;
      const changed = !stale && (!badge || badge.dataset.runStatus !== data.status);
      const bar = root.querySelector("[data-progress]");
      const shown = bar ? Number(bar.parentElement.getAttribute("aria-valuenow")) : 0;
      if (known(data.progress) && Math.round(data.progress * 100) > shown) setProgress(data.progress);
      if (!changed) return;
      status(data);
      root.querySelectorAll('[hx-trigger*="live:run.status"]').forEach(function (el) {
        window.htmx.trigger(el, "live:run.status", data);
      });
    }

    // Fetches the points after `since`, page by page, then applies the run's status.
    function backfill(since, tries) {
      fetch(root.dataset.timelineUrl + "?since=" + since, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; }, function () {
          // The server is unreachable for now: a few tries, then the next reconnect backfills.
          if (tries < 3) setTimeout(function () { backfill(since, tries + 1); }, 2000);
          return null;
        })
        .then(function (data) {
          if (!data) return;
          extend(data.points);
          if (data.more && data.points.length) return backfill(data.points[data.points.length - 1].t, 0);
          caughtUp(data);
          window.__runLive.backfills += 1;
        });
    }

    const live = root.closest("[data-live-socket]") || (root.matches("[data-live-socket]") ? root : null);
    // For the browser tests: the current socket, the way points reach the charts, and how
    // many backfills have completed.
    window.__runLive = {
      get socket() { return live ? live.liveSocket : null; },
      extend: extend,
      caughtUp: caughtUp,
      maxScatter: MAX_SCATTER,
      backfills: 0,
    };
    if (!live) return;
    live.addEventListener("live:run.point", function (event) { extend([event.detail]); });
    live.addEventListener("live:run.status", function (event) { status(event.detail); });
    // `last` now, not when the reply comes: live points may arrive before it.
    live.addEventListener("live:open", function () { backfill(last, 0); });
  });
})();
