// Live updates for the Chronoshard console. Pages work without this script; with it, a
// section marked data-live="URL" is refreshed every 2 s from that same-origin JSON
// endpoint (the session cookie goes along), and replaced only when it changed. The
// HTML it swaps in was rendered and escaped by the server, as a reload would be.
(function () {
  "use strict";
  var PERIOD_MS = 2000;
  var section = document.querySelector("[data-live]");
  if (!section) {
    return;
  }
  var url = section.getAttribute("data-live");
  var last = section.innerHTML;

  function refresh() {
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (reply) {
        if (reply.status === 401) {
          window.location.assign("/login");
          return null;
        }
        return reply.ok ? reply.json() : null;
      })
      .then(function (data) {
        if (data && typeof data.html === "string") {
          if (data.html !== last) {
            section.innerHTML = data.html;
            last = data.html;
          }
          section.setAttribute("data-updated", new Date().toISOString());
          if (data.live === false) {
            section.removeAttribute("data-live");
            return;
          }
        }
        window.setTimeout(refresh, PERIOD_MS);
      })
      .catch(function () {
        window.setTimeout(refresh, PERIOD_MS);
      });
  }

  window.setTimeout(refresh, PERIOD_MS);
})();
