// History: the Compare button is live only with 2 to 4 runs ticked.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    const form = document.querySelector("[data-compare-form]");
    if (!form) return;
    const button = form.querySelector("[data-compare-button]");
    const count = form.querySelector("[data-selected-count]");
    function update() {
      const n = form.querySelectorAll("input[name=runs]:checked").length;
      button.disabled = n < 2 || n > 4;
      count.textContent = n ? n + " ticked" + (n > 4 ? " (at most 4)" : n < 2 ? " (at least 2)" : "") : "Tick 2 to 4 runs";
    }
    form.addEventListener("change", update);
    update();
  });
})();
