// Live numbers without a full reload: every second (while the tab is visible) fetch this
// same page and swap in those of its [data-live] parts that changed. A part with a form
// changes only when what the form would do changes (a failover switch that now restores),
// so what a person is typing stays. The page works the same without this script, by
// reloading.
(() => {
  "use strict";
  const live = () => document.querySelectorAll("[data-live][id]");
  if (!live().length) return;
  const stamp = document.getElementById("live-stamp");
  let busy = false;

  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const answer = await fetch(location.href, {
        headers: { "X-Sluice-Live": "1" },
        credentials: "same-origin",
        cache: "no-store",
      });
      if (answer.status === 401) {  // the session ended: the full page goes to the login
        location.reload();
        return;
      }
      if (!answer.ok) throw new Error(`the console answered ${answer.status}`);
      const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
      for (const part of live()) {
        const next = fresh.getElementById(part.id);
        if (next && next.outerHTML !== part.outerHTML) part.replaceWith(document.adoptNode(next));
      }
      if (stamp) {
        stamp.textContent = `live · ${new Date().toISOString().slice(11, 19)} UTC`;
        stamp.classList.remove("stale");
      }
    } catch (err) {
      if (stamp) {
        stamp.textContent = `not updating (${err.message}): retrying`;
        stamp.classList.add("stale");
      }
    } finally {
      busy = false;
    }
  }

  setInterval(refresh, 1000);
  document.addEventListener("visibilitychange", refresh);
})();
