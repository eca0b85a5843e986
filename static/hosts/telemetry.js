// GPU telemetry on the host page. Per GPU four plotly charts on one time axis: utilisation,
// memory and power (+ limit); SM and memory clocks; clock-event (throttle) reasons as the share
// of samples each was active; PCIe TX/RX. The server embeds the last 10 minutes; range buttons
// (10 min / 1 h / 24 h / 7 d) fetch the series the server buckets for that range; dragging a
// window on any chart zooms every chart of the host to it and fetches finer data for it;
// "Reset zoom" goes back to the range. Only the 10-minute range is live: every "telemetry"
// event from the host's socket is appended in place (no redraw), and the stored samples are
// backfilled whenever the socket (re)opens, so a dropped connection leaves no gap.
(function () {
  "use strict";
  const MAX_POINTS = 600; // ten minutes at one sample a second
  const RANGE_WORDS = { "10m": "last 10 min", "1h": "last hour", "24h": "last 24 h", "7d": "last 7 days", "30d": "last 30 days", "1y": "last year" };
  const SOURCE_WORDS = { raw: "1-second samples", minute: "minute aggregates", hour: "hourly aggregates" };
  const CONFIG = { displayModeBar: false, responsive: true };

  document.addEventListener("DOMContentLoaded", function () {
    const root = document.querySelector("[data-telemetry]");
    if (!root || !window.Plotly) return;
    const live = root.closest("[data-live-socket]");
    const status = document.querySelector("[data-telemetry-status]");
    const resetButton = document.querySelector("[data-reset-zoom]");
    const rangeButtons = document.querySelectorAll("[data-telemetry-range]");
    const url = root.dataset.backfillUrl;
    const state = { range: "10m", zoom: null, data: null, applying: 0, request: 0 };
    const charts = {}; // GPU pk → {main, clocks, throttle, pcie, last, points}
    let reasons = [];

    function toMs(value) {
      if (typeof value === "number") return value;
      return Date.parse(String(value).replace(" ", "T") + "Z"); // plotly's dates are UTC
    }

    function xaxis(extra) {
      const axis = Object.assign({ type: "date" }, extra || {});
      if (state.zoom) axis.range = [state.zoom.start, state.zoom.end];
      else if (state.range !== "10m" && state.data) axis.range = [state.data.start, state.data.end];
      else axis.autorange = true;
      return axis;
    }

    function base(title, height) {
      return {
        title: { text: title, font: { size: 13 } },
        margin: { l: 55, r: 10, t: 30, b: 30 },
        height: height,
        dragmode: "zoom",
        legend: { orientation: "h", y: -0.25, font: { size: 11 } },
      };
    }

    // With every reason hidden (none active: the usual case) plotly would autorange the time
    // axis to the year 2000; an invisible trace over the same times keeps it on the window.
    function AXIS_KEEPER(x) {
      return { x: x, y: x.map(function () { return 0; }), mode: "lines", line: { width: 0 }, hoverinfo: "skip", showlegend: false, name: "" };
    }

    function figures(s) {
      const x = s.t;
      const pct = function (arr) { return arr.map(function (v) { return v === null ? null : Math.round(v * 1000) / 10; }); };
      const main = Object.assign(base("GPU" + s.index + " · " + s.name, 300), {
        showlegend: false,
        xaxis: xaxis({ anchor: "y3" }),
        yaxis: { domain: [0.7, 1], title: { text: "util %" }, range: [0, 100], fixedrange: true },
        yaxis2: { domain: [0.36, 0.64], title: { text: "mem GiB" }, range: [0, s.memory_total_gib], fixedrange: true },
        yaxis3: { domain: [0, 0.3], title: { text: "power W" }, rangemode: "tozero", fixedrange: true },
      });
      const clocks = Object.assign(base("GPU" + s.index + " clocks (MHz)", 240), {
        xaxis: xaxis(), yaxis: { title: { text: "MHz" }, rangemode: "tozero", fixedrange: true },
      });
      const throttle = Object.assign(base("GPU" + s.index + " clock-event (throttle) reasons", 240), {
        xaxis: xaxis(), yaxis: { title: { text: "% of samples" }, range: [0, 105], fixedrange: true },
      });
      const pcie = Object.assign(base("GPU" + s.index + " PCIe (MB/s)", 240), {
        xaxis: xaxis(), yaxis: { title: { text: "MB/s" }, rangemode: "tozero", fixedrange: true },
      });
      return {
        main: [[
          { x: x, y: s.utilization, yaxis: "y", name: "utilisation %", mode: "lines" },
          { x: x, y: s.memory_gib, yaxis: "y2", name: "memory GiB", mode: "lines" },
          { x: x, y: s.power_w, yaxis: "y3", name: "power W", mode: "lines" },
          { x: x, y: s.power_limit_w, yaxis: "y3", name: "power limit W", mode: "lines", line: { dash: "dot", width: 1 } },
        ], main],
        clocks: [[
          { x: x, y: s.sm_clock_mhz, name: "SM clock MHz", mode: "lines" },
          { x: x, y: s.mem_clock_mhz, name: "memory clock MHz", mode: "lines" },
        ], clocks],
        throttle: [reasons.map(function (r) {
          const y = pct(s.throttle[r.key] || []);
          // Every reason is in the legend; those never active start hidden (click to show).
          const active = y.some(function (v) { return v; });
          return { x: x, y: y, name: r.label, mode: "lines", visible: active ? true : "legendonly" };
        }).concat([AXIS_KEEPER(x)]), throttle],
        pcie: [[
          { x: x, y: s.pcie_tx_mbs, name: "TX MB/s", mode: "lines" },
          { x: x, y: s.pcie_rx_mbs, name: "RX MB/s", mode: "lines" },
        ], pcie],
      };
    }

    function describe(data) {
      if (state.zoom) {
        return "Zoomed: " + SOURCE_WORDS[data.source] + " in " + data.bucket_s + " s buckets" + (data.empty ? " — " + data.empty : "");
      }
      if (data.empty) return RANGE_WORDS[state.range] + ": " + data.empty;
      const bucket = data.bucket_s >= 3600 ? data.bucket_s / 3600 + " h" : data.bucket_s >= 60 ? data.bucket_s / 60 + " min" : data.bucket_s + " s";
      return RANGE_WORDS[state.range] + " from " + SOURCE_WORDS[data.source] + (data.bucket_s > 1 ? " (" + bucket + " buckets)" : "") + (state.range === "10m" ? ", live" : "");
    }

    function draw(data) {
      state.data = data;
      reasons = data.throttle_reasons || reasons;
      const drawing = [];
      state.applying += 1;
      Object.entries(data.gpus).forEach(function ([pk, s]) {
        const holder = root.querySelector('[data-gpu-telemetry="' + pk + '"]');
        if (!holder) return;
        const figs = figures(s);
        const chart = charts[pk] || (charts[pk] = {});
        ["main", "clocks", "throttle", "pcie"].forEach(function (kind) {
          const el = holder.querySelector('[data-chart-kind="' + kind + '"]');
          chart[kind] = el;
          drawing.push(window.Plotly.react(el, figs[kind][0], figs[kind][1], CONFIG).then(function () {
            el.dataset.rendered = "true";
            if (!el.dataset.zoomBound) { el.dataset.zoomBound = "true"; el.on("plotly_relayout", onRelayout); }
          }));
        });
        chart.last = s.t.length ? s.t[s.t.length - 1] : 0;
        chart.points = s.t.length;
        chart.main.dataset.points = String(s.t.length);
      });
      root.dataset.range = state.range;
      root.dataset.source = data.source;
      root.dataset.bucket = String(data.bucket_s);
      if (state.zoom) { root.dataset.zoom = state.zoom.start + "-" + state.zoom.end; } else { delete root.dataset.zoom; }
      if (status) { status.textContent = describe(data); status.classList.toggle("warn", !!data.empty); }
      if (resetButton) resetButton.hidden = !state.zoom;
      rangeButtons.forEach(function (b) { b.setAttribute("aria-pressed", String(b.dataset.telemetryRange === state.range)); });
      return Promise.all(drawing).finally(function () { state.applying -= 1; });
    }

    function load(params) {
      const ticket = ++state.request; // a slower earlier answer must not overwrite a newer one
      root.dataset.loading = "true";
      return fetch(url + "?" + new URLSearchParams(params), { credentials: "same-origin" })
        .then(function (r) { return r.json().then(function (body) { return { ok: r.ok, body: body }; }); })
        .then(function (answer) {
          if (ticket !== state.request) return null;
          if (!answer.ok) { if (status) status.textContent = answer.body.error || "the telemetry could not be read"; return null; }
          return draw(answer.body);
        })
        .finally(function () { if (ticket === state.request) delete root.dataset.loading; });
    }

    // Zoom: a drag on one chart moves every chart to that window at once, then finer data for
    // the window replaces what is drawn when the current buckets are coarser than it needs.
    function onRelayout(event) {
      if (state.applying) return; // our own relayouts of the other charts
      if (event["xaxis.autorange"]) { resetZoom(); return; } // a double click
      const a = event["xaxis.range[0]"], b = event["xaxis.range[1]"];
      if (a === undefined || b === undefined) return;
      zoomTo(toMs(a), toMs(b));
    }

    function zoomTo(start, end) {
      if (!(end > start)) return;
      state.zoom = { start: Math.round(start), end: Math.round(end) };
      root.dataset.zoom = state.zoom.start + "-" + state.zoom.end;
      if (resetButton) resetButton.hidden = false;
      const moves = [];
      state.applying += 1;
      Object.values(charts).forEach(function (chart) {
        ["main", "clocks", "throttle", "pcie"].forEach(function (kind) {
          if (chart[kind]) moves.push(window.Plotly.relayout(chart[kind], { "xaxis.range": [state.zoom.start, state.zoom.end] }));
        });
      });
      Promise.all(moves).finally(function () { state.applying -= 1; });
      const wanted = Math.max(1, Math.ceil((end - start) / 1000 / MAX_POINTS));
      if (state.data && wanted < state.data.bucket_s && end - start >= 10000) {
        load({ start: state.zoom.start, end: state.zoom.end });
      }
    }

    function resetZoom() {
      state.zoom = null;
      return load({ range: state.range });
    }

    rangeButtons.forEach(function (button) {
      button.addEventListener("click", function () {
        state.range = button.dataset.telemetryRange;
        state.zoom = null;
        load({ range: state.range });
      });
    });
    if (resetButton) resetButton.addEventListener("click", resetZoom);

    function extend(pk, ts, p) {
      const chart = charts[pk];
      if (!chart || state.range !== "10m" || state.zoom) return;
      const keep = [];
      ts.forEach(function (t, i) { if (t > chart.last) keep.push(i); });
      if (!keep.length) return; // already drawn (a backfill racing a live event)
      const pick = function (arr) { return keep.map(function (i) { return arr[i]; }); };
      const x = pick(ts);
      const xs = function (n) { return Array(n).fill(x); };
      window.Plotly.extendTraces(chart.main, { x: xs(4), y: [pick(p.utilization), pick(p.memory_gib), pick(p.power_w), pick(p.power_limit_w)] }, [0, 1, 2, 3], MAX_POINTS);
      window.Plotly.extendTraces(chart.clocks, { x: xs(2), y: [pick(p.sm_clock_mhz), pick(p.mem_clock_mhz)] }, [0, 1], MAX_POINTS);
      window.Plotly.extendTraces(chart.pcie, { x: xs(2), y: [pick(p.pcie_tx_mbs), pick(p.pcie_rx_mbs)] }, [0, 1], MAX_POINTS);
      if (reasons.length) {
        const shares = reasons.map(function (r) { return pick(p.throttle[r.key] || []).map(function (v) { return v === null || v === undefined ? null : v * 100; }); });
        shares.push(x.map(function () { return 0; })); // the axis keeper follows the live window
        window.Plotly.extendTraces(chart.throttle, { x: xs(reasons.length + 1), y: shares }, reasons.map(function (_r, i) { return i; }).concat([reasons.length]), MAX_POINTS);
      }
      chart.last = x[x.length - 1];
      chart.points += x.length;
      chart.main.dataset.points = String(chart.points);
    }

    function livePoint(point) {
      const mask = point.clocks_event_reasons;
      const throttle = {};
      reasons.forEach(function (r) { throttle[r.key] = [mask === null || mask === undefined ? null : (mask & r.bit ? 1 : 0)]; });
      const mbs = function (kbps) { return kbps === null || kbps === undefined ? null : kbps / 1000; };
      return {
        utilization: [point.utilization_pct], memory_gib: [point.memory_used_gib], power_w: [point.power_w],
        power_limit_w: [point.power_limit_w], sm_clock_mhz: [point.sm_clock_mhz], mem_clock_mhz: [point.mem_clock_mhz],
        pcie_tx_mbs: [mbs(point.pcie_tx_kbps)], pcie_rx_mbs: [mbs(point.pcie_rx_kbps)], throttle: throttle,
      };
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

    draw(JSON.parse(document.getElementById(root.dataset.telemetry).textContent));
    if (!live) return;

    live.addEventListener("live:telemetry", function (event) {
      const data = event.detail;
      data.gpus.forEach(function (p) {
        extend(String(p.gpu), [data.t], livePoint(p));
        showNow(p);
      });
    });

    live.addEventListener("live:open", function () {
      if (state.range !== "10m" || state.zoom) return; // only the live range is backfilled
      const since = Math.min.apply(null, Object.values(charts).map(function (c) { return c.last; }).concat([Date.now()]));
      fetch(url + "?since=" + since, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) {
          if (!data) return;
          Object.entries(data.gpus).forEach(function ([pk, s]) { extend(pk, s.t, s); });
        });
    });
  });
})();
