// The change page's live timeline. The server renders the timeline so far; each
// "change.event" from the change's socket (live.js) is one more item, appended in place and
// deduplicated by its id; "change.state" updates the state badge (live.js itself makes htmx
// re-fetch the fragments that follow it). Whenever the socket (re)opens, the whole timeline is
// fetched and merged by id, so a dropped connection leaves no gap and no duplicate.
(function () {
  "use strict";

  function pad(n) { return String(n).padStart(2, "0"); }

  function when(iso) {
    const d = new Date(iso);
    if (isNaN(d)) return iso;
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(function ([k, v]) { node.setAttribute(k, v); });
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  // The same markup as templates/changes/_timeline_item.html, built with textContent only.
  function render(item) {
    const after = item.after || {};
    const colour = item.colour || "grey";
    const li = el("li", {
      class: "timeline-item " + colour,
      "data-testid": "timeline-item",
      "data-id": String(item.id),
      "data-action": item.action || "",
      "data-stage": after.stage || "",
      "data-status": after.status || "",
    });
    li.appendChild(el("span", { class: "dot " + colour, "aria-hidden": "true" }));
    const body = el("div", { class: "body" });
    const head = el("div");
    head.appendChild(el("strong", { "data-title": "" }, item.title || item.action));
    head.appendChild(document.createTextNode(" "));
    const meta = el("span", { class: "muted" }, (item.who || "system") + " · ");
    meta.appendChild(el("time", { datetime: item.at }, when(item.at)));
    head.appendChild(meta);
    body.appendChild(head);
    if (item.message) body.appendChild(el("p", { class: "message" }, item.message));
    if (item.detail) {
      const details = el("details");
      details.appendChild(el("summary", {}, "Details"));
      details.appendChild(el("pre", {}, item.detail));
      body.appendChild(details);
    }
    // Only the panel's own pages: a link is never a javascript: or off-site URL.
    if (typeof item.link === "string" && item.link.charAt(0) === "/" && item.link.charAt(1) !== "/") {
      body.appendChild(el("a", { href: item.link }, "Open"));
    }
    li.appendChild(body);
    return li;
  }

  document.addEventListener("DOMContentLoaded", function () {
    const root = document.querySelector("[data-change][data-live-socket]");
    if (!root) return;
    const list = root.querySelector("[data-timeline]");
    const badge = root.querySelector("[data-change-state]");

    function add(item) {
      if (!list || item.id === undefined || list.querySelector('[data-id="' + item.id + '"]')) return;
      const node = render(item);
      // Keep the order of the log (ids grow): a backfilled item may belong before live ones.
      const later = Array.prototype.find.call(list.children, function (child) {
        return Number(child.dataset.id) > item.id;
      });
      list.insertBefore(node, later || null);
    }

    function state(data) {
      if (!badge || !data.state) return;
      // A flash ("You approved change #1.") told what the page looked like when it loaded;
      // once the state moves on it is history (the timeline keeps it), so it goes.
      if (badge.dataset.changeState !== data.state) {
        document.querySelectorAll(".flash[role='status']").forEach(function (flash) { flash.remove(); });
      }
      badge.dataset.changeState = data.state;
      badge.textContent = data.label || data.state;
      badge.className = "badge " + (data.colour || "grey");
    }

    root.querySelectorAll("time[datetime]").forEach(function (t) { t.textContent = when(t.getAttribute("datetime")); });
    root.addEventListener("live:change.event", function (event) { add(event.detail); });
    root.addEventListener("live:change.state", function (event) { state(event.detail); });
    root.addEventListener("live:open", function () {
      fetch(root.dataset.timelineUrl, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) {
          if (!data) return;
          // live.js re-fetches the fragments (actions, status, facts) on open; the badge and
          // the timeline are this script's.
          data.items.forEach(add);
          state(data);
        });
    });
  });
})();
