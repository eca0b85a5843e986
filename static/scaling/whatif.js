// While a what-if computes, poll its status and show the progress; reload once it has finished.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    const box = document.querySelector("[data-whatif-status]");
    if (!box) return;
    const bar = box.querySelector("[data-whatif-progress]");
    function poll() {
      fetch(box.dataset.whatifStatus, { headers: { Accept: "application/json" } })
        .then(function (r) { return r.json(); })
        .then(function (s) {
          if (bar) bar.value = s.progress;
          if (s.finished) window.location.reload();
          else setTimeout(poll, 1000);
        })
        .catch(function () { setTimeout(poll, 3000); });
    }
    poll();
  });
})();
