/* Jobdeck dashboard behaviour. CSP forbids inline script and eval, so all
 * of it lives here:
 *  - live polling: every data-poll-seconds, while the tab is visible, fire a
 *    "jd-poll" event on <body>; polled fragments listen with
 *    hx-trigger="jd-poll from:body". A hidden tab sends nothing; coming back
 *    refreshes at once.
 *  - row selection survives the table body being re-rendered by a poll,
 *    from the moment the new rows are in (not only once htmx settles them).
 *  - [data-dismiss] closes a flash message or a confirmation.
 *  - failed requests say so in the flash area instead of failing silently.
 *  - times: every <time datetime title> shows its relative text, or with the
 *    "Exact times" switch its title (the UTC time); the choice is kept in
 *    localStorage and reapplied after every swap.
 *  - a [data-submit-on-change] field (the type filter) submits its form.
 *  - /jobs/<id>#job-edit opens the edit-and-retry form (the overview's
 *    "Fix payload" link).
 *  - the Menu button (shown on a phone only) opens and closes the nav and
 *    the user's controls; Escape or a click outside closes them.
 */
(function () {
  "use strict";

  var body = document.body;
  var seconds = parseFloat(body.getAttribute("data-poll-seconds")) || 3;
  var selected = new Set();

  function poll() {
    if (document.visibilityState === "visible") {
      htmx.trigger(body, "jd-poll");
    }
  }
  var timer = setInterval(poll, seconds * 1000);
  document.addEventListener("visibilitychange", function () {
    clearInterval(timer);
    if (document.visibilityState === "visible") {
      poll();
      timer = setInterval(poll, seconds * 1000);
    }
  });

  function boxes() {
    return Array.prototype.slice.call(document.querySelectorAll("input.row-select"));
  }

  function syncSelection() {
    var all = boxes();
    all.forEach(function (box) { box.checked = selected.has(box.value); });
    var visible = all.filter(function (box) { return box.checked; }).length;
    var counter = document.getElementById("selected-count");
    if (counter) {
      counter.textContent = selected.size + " selected";
      counter.classList.toggle("has-selection", selected.size > 0);
    }
    document.querySelectorAll("[data-needs-selection]").forEach(function (button) {
      button.disabled = visible === 0;
    });
    var selectAll = document.getElementById("select-all");
    if (selectAll) {
      selectAll.checked = all.length > 0 && visible === all.length;
      selectAll.indeterminate = visible > 0 && visible < all.length;
    }
    all.forEach(function (box) {
      var row = box.closest("tr");
      if (row) { row.classList.toggle("selected", box.checked); }
    });
  }

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target.hasAttribute && target.hasAttribute("data-submit-on-change") && target.form) {
      target.form.requestSubmit();
    } else if (target.classList && target.classList.contains("row-select")) {
      if (target.checked) { selected.add(target.value); } else { selected.delete(target.value); }
      syncSelection();
    } else if (target.id === "select-all") {
      boxes().forEach(function (box) {
        if (target.checked) { selected.add(box.value); } else { selected.delete(box.value); }
      });
      syncSelection();
    }
  });

  body.addEventListener("jd-selection-clear", function () {
    selected.clear();
    syncSelection();
  });

  function reselect() {
    // Only ids still on screen stay selected: a job that moved on can no
    // longer be acted on from this list.
    var present = new Set(boxes().map(function (box) { return box.value; }));
    selected.forEach(function (id) { if (!present.has(id)) { selected.delete(id); } });
    syncSelection();
  }
  // A poll's rows come unticked from the server. They are ticked in the
  // swap's own task: htmx settles a timer later (longer in a busy browser),
  // and a "Retry selected" clicked in between sent the unticked boxes, no
  // job at all, while the page said "1 selected". Again once settled, as
  // settling puts back the rows' server-rendered class (the highlight).
  body.addEventListener("htmx:afterSwap", reselect);
  body.addEventListener("htmx:afterSettle", reselect);

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-dismiss]") : null;
    if (!button) { return; }
    var what = button.getAttribute("data-dismiss");
    if (what === "flash") {
      var message = button.closest(".flash");
      if (message) { message.remove(); }
    } else {
      var slot = document.getElementById(what);
      if (slot) { slot.innerHTML = ""; }
    }
  });

  function say(text) {
    var area = document.getElementById("flash");
    if (!area) { return; }
    var box = document.createElement("div");
    box.className = "flash flash-error";
    box.setAttribute("role", "status");
    var span = document.createElement("span");
    span.textContent = text;
    var close = document.createElement("button");
    close.type = "button";
    close.className = "flash-close";
    close.setAttribute("data-dismiss", "flash");
    close.setAttribute("aria-label", "Dismiss");
    close.textContent = "\u00d7";
    box.appendChild(span);
    box.appendChild(close);
    area.replaceChildren(box);
  }

  // A bulk action's next batch did not go through: say it was cut short, not "…" forever.
  function bulkInterrupted(event) {
    var elt = event.detail && event.detail.elt;
    var box = elt && elt.closest ? elt.closest(".bulk-progress[data-interrupted]") : null;
    if (!box || box.classList.contains("is-interrupted")) { return false; }
    box.classList.add("is-interrupted");
    var status = box.querySelector(".bulk-status");
    if (status) { status.textContent = box.getAttribute("data-interrupted"); }
    var close = document.createElement("button");
    close.type = "button";
    close.className = "btn btn-sm btn-ghost";
    close.setAttribute("data-dismiss", "confirm");
    close.textContent = "Close";
    box.appendChild(close);
    return true;
  }

  body.addEventListener("htmx:responseError", function (event) {
    var xhr = event.detail.xhr;
    if (xhr.status >= 500) { bulkInterrupted(event); }  // and the flash says why, below
    var told = null;
    try {  // the server's own words when it sent them (a full disk, a read-only database)
      var doc = new DOMParser().parseFromString(xhr.responseText || "", "text/html");
      var flash = doc.querySelector(".flash span");
      if (flash) { told = flash.textContent.trim(); }
    } catch (e) { /* not HTML: the status alone */ }
    say(told ? told + " (" + xhr.status + "; nothing was changed by this page)" :
      "The server answered " + xhr.status + " " + (xhr.statusText || "") + "; nothing was changed by this page.");
  });
  body.addEventListener("htmx:sendError", function (event) {
    body.classList.add("offline");
    bulkInterrupted(event);
  });
  body.addEventListener("htmx:afterRequest", function (event) {
    if (event.detail.successful) { body.classList.remove("offline"); }
  });

  var TIMES_KEY = "jobdeck.times";
  var exact = false;
  try { exact = localStorage.getItem(TIMES_KEY) === "exact"; } catch (e) { /* storage off: relative */ }

  function showTimes() {
    document.querySelectorAll("time[datetime][title]").forEach(function (el) {
      if (!el.hasAttribute("data-relative")) { el.setAttribute("data-relative", el.textContent); }
      el.textContent = exact ? el.getAttribute("title") : el.getAttribute("data-relative");
    });
    var toggle = document.getElementById("time-toggle");
    if (toggle) { toggle.setAttribute("aria-pressed", exact ? "true" : "false"); }
  }

  document.addEventListener("click", function (event) {
    var toggle = event.target.closest ? event.target.closest("#time-toggle") : null;
    if (!toggle) { return; }
    exact = !exact;
    try { localStorage.setItem(TIMES_KEY, exact ? "exact" : "relative"); } catch (e) { /* storage off: this page only */ }
    showTimes();
  });
  body.addEventListener("htmx:afterSettle", showTimes);

  function openEditFromLink() {
    if (location.hash !== "#job-edit") { return; }
    var form = document.querySelector("#job-edit details");
    if (!form) { return; }
    form.open = true;
    var text = form.querySelector("textarea");
    if (text) { text.focus(); }
  }

  function setMenu(open, refocus) {
    var toggle = document.getElementById("menu-toggle");
    var bar = toggle && toggle.closest(".topbar");
    if (!bar) { return; }
    bar.classList.toggle("menu-open", open);
    toggle.setAttribute("aria-expanded", open ? "true" : "false");
    if (refocus) { toggle.focus(); }
  }

  document.addEventListener("click", function (event) {
    if (!event.target.closest) { return; }
    var toggle = event.target.closest("#menu-toggle");
    if (toggle) {
      setMenu(toggle.getAttribute("aria-expanded") !== "true", false);
    } else if (!event.target.closest("#topmenu")) {
      setMenu(false, false);
    }
  });
  document.addEventListener("keydown", function (event) {
    var toggle = document.getElementById("menu-toggle");
    if (event.key === "Escape" && toggle && toggle.getAttribute("aria-expanded") === "true") {
      setMenu(false, true);
    }
  });

  syncSelection();
  showTimes();
  openEditFromLink();
})();
