// The "Menu" button of the top bar: below the breakpoint in panel.css the navigation and the
// user menu are folded away, and this button opens and closes them. A file of its own rather
// than an inline script, so that a Content-Security-Policy without 'unsafe-inline' keeps it.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    const button = document.querySelector(".topbar .nav-toggle");
    if (!button) return;
    const header = button.closest(".topbar");
    function setOpen(open) {
      button.setAttribute("aria-expanded", open ? "true" : "false");
      header.classList.toggle("nav-open", open);
    }
    // A <button> already answers Enter and Space; this is all the keyboard needs.
    button.addEventListener("click", function () {
      setOpen(button.getAttribute("aria-expanded") !== "true");
    });
    // Escape closes the open menu and gives focus back to the button, as a disclosure should.
    header.addEventListener("keydown", function (event) {
      if (event.key === "Escape" && header.classList.contains("nav-open")) {
        setOpen(false);
        button.focus();
      }
    });
    // A click outside the open menu closes it (as on a phone one taps the page to dismiss it).
    document.addEventListener("click", function (event) {
      if (header.classList.contains("nav-open") && !header.contains(event.target)) setOpen(false);
    });
  });
})();
