// Live updates: an element with data-live-socket="/ws/..." opens that WebSocket and turns each
// event {event, data} into an htmx trigger "live:<event>" on the elements inside it, so the
// server re-renders the affected fragment (hx-trigger="live:check.updated").
(function () {
  "use strict";

  // Events published while no socket was open (between the page's render and the first open,
  // or during an outage) are lost: each fragment that follows live events is fetched again.
  function refresh(root) {
    root.querySelectorAll('[hx-trigger*="live:"]').forEach(function (el) {
      const event = el.getAttribute("hx-trigger").match(/live:[^\s,]+/);
      if (event) window.htmx.trigger(el, event[0], {});
    });
  }

  function connect(root) {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const url = scheme + window.location.host + root.dataset.liveSocket;
    const state = root.querySelector("[data-live-state]");
    let retry = 1000;

    function open() {
      const socket = new WebSocket(url);
      root.liveSocket = socket; // the current one, for the page's own scripts and its tests
      socket.addEventListener("open", function () {
        retry = 1000;
        root.dataset.liveConnected = "true";
        if (state) state.textContent = "live";
        refresh(root);
        // Pages that keep their own data (charts) backfill what they missed while closed.
        root.dispatchEvent(new CustomEvent("live:open"));
      });
      socket.addEventListener("message", function (message) {
        const payload = JSON.parse(message.data);
        if (!payload.event) return;
        root.querySelectorAll('[hx-trigger*="live:' + payload.event + '"]').forEach(function (el) {
          window.htmx.trigger(el, "live:" + payload.event, payload.data);
        });
        root.dispatchEvent(new CustomEvent("live:" + payload.event, { detail: payload.data }));
      });
      socket.addEventListener("close", function (event) {
        root.dataset.liveConnected = "false";
        if (event.code === 4403) {
          if (state) state.textContent = "not allowed";
          return;
        }
        if (event.code === 4401) {
          // The session ended (logout): a new socket would be refused.
          if (state) state.textContent = "logged out";
          return;
        }
        if (state) state.textContent = "reconnecting…";
        setTimeout(open, retry);
        retry = Math.min(retry * 2, 30000);
      });
    }
    open();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live-socket]").forEach(connect);
  });
})();
