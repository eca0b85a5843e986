// The scaling page: live signal charts and "now" tiles for one deployment. The server embeds
// the last 15 minutes as plotly figures whose traces name their signal (trace.meta.path and
// .scale); every "deployment.signals" event of this deployment on the host's socket appends
// a point, and whenever the socket (re)opens the charts backfill from signals_json, so a
// dropped connection leaves no gap. Also keeps the export links in step with the form.
(function () {
  "use strict";
  const MAX_POINTS = 900; // fifteen minutes at one poll a second

  function resolve(signals, meta) {
    let value = signals;
    meta.path.split(".").forEach(function (part) {
      value = value !== null && typeof value === "object" ? value[part] : null;
    });
    return typeof value === "number" ? value * meta.scale : null;
  }

  function wireExports(root) {
    const form = root.querySelector("[data-testid=export-params]");
    if (!form) return;
    const links = root.querySelectorAll("a[data-export]");
    const bases = Array.from(links).map(function (a) { return a.getAttribute("href"); });
    form.addEventListener("input", function () {
      const query = new URLSearchParams();
      form.querySelectorAll("input").forEach(function (input) {
        if (input.value.trim()) query.set(input.name, input.value.trim());
      });
      const tail = query.toString() ? "?" + query.toString() : "";
      links.forEach(function (a, i) { a.setAttribute("href", bases[i] + tail); });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    const root = document.querySelector("[data-scaling]");
    if (!root) return;
    wireExports(root);
    const source = document.getElementById("scaling-charts");
    if (!source || !window.Plotly) return;
    const id = Number(root.dataset.scaling);
    const charts = [];
    let last = 0;
    let points = 0;

    JSON.parse(source.textContent).forEach(function (chart) {
      const el = root.querySelector('[data-scaling-chart="' + chart.key + '"]');
      if (!el) return;
      const xs = chart.figure.data.length ? chart.figure.data[0].x : [];
      if (xs.length) last = Math.max(last, xs[xs.length - 1]);
      points = Math.max(points, xs.length);
      charts.push({ el: el, metas: chart.figure.data.map(function (t) { return t.meta; }) });
      window.Plotly.newPlot(el, chart.figure.data, chart.figure.layout, { displayModeBar: false, responsive: true })
        .then(function () { el.dataset.rendered = "true"; el.dataset.points = String(xs.length); });
    });
    root.dataset.points = String(points);

    // ts: epoch ms ascending; valueOf(meta, i): the i-th value of the trace's signal.
    function extend(ts, valueOf) {
      const keep = [];
      ts.forEach(function (t, i) { if (t > last) keep.push(i); });
      if (!keep.length) return; // already drawn (a backfill racing a live event)
      const x = keep.map(function (i) { return ts[i]; });
      charts.forEach(function (chart) {
        const update = { x: [], y: [] };
        chart.metas.forEach(function (meta) {
          update.x.push(x);
          update.y.push(keep.map(function (i) { return valueOf(meta, i); }));
        });
        window.Plotly.extendTraces(chart.el, update, chart.metas.map(function (_, n) { return n; }), MAX_POINTS);
        chart.el.dataset.points = String(Number(chart.el.dataset.points || 0) + x.length);
      });
      last = x[x.length - 1];
      points += x.length;
      root.dataset.points = String(points);
    }

    function showNow(signals) {
      root.querySelectorAll("[data-signal]").forEach(function (el) {
        const value = resolve(signals, { path: el.dataset.signal, scale: Number(el.dataset.scale || 1) });
        const digits = Number(el.dataset.digits || 0);
        el.textContent = value === null ? "—" : value.toLocaleString("en", { minimumFractionDigits: digits, maximumFractionDigits: digits }) + (el.dataset.unit || "");
      });
      const basis = root.querySelector("[data-signal-basis]");
      if (basis && signals.pending_basis) basis.textContent = signals.pending_basis;
      const age = root.querySelector("[data-signal-age]");
      if (age) age.dataset.at = String(signals.at);
      showAge(); // at once: "No signals yet" must not outlive the first signals by a second
    }

    // The age of the newest signals, counted here between events.
    function showAge() {
      const age = root.querySelector("[data-signal-age]");
      if (!age || !age.dataset.at) return;
      const seconds = Math.max(0, Date.now() / 1000 - Number(age.dataset.at));
      age.textContent = "Signals read " + seconds.toFixed(0) + " s ago";
    }
    setInterval(showAge, 1000);

    root.addEventListener("live:deployment.signals", function (event) {
      const data = event.detail;
      if (!data || data.id !== id) return;
      root.dataset.liveEvents = String(Number(root.dataset.liveEvents || 0) + 1);
      extend([data.t], function (meta) { return resolve(data.signals, meta); });
      showNow(data.signals);
    });

    root.addEventListener("live:open", function () {
      const since = last || Date.now() - 15 * 60 * 1000;
      fetch(root.dataset.signalsUrl + "?since=" + since, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) {
          if (!data || !data.t.length) return;
          extend(data.t, function (meta, i) {
            const column = data.values[meta.path];
            return column ? column[i] : null;
          });
        });
    });
  });
})();
