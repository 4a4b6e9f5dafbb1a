// Sortable tables: click a header to sort by that column (numbers by their data-v value,
// text otherwise); click again to reverse. Links to a sample scroll to it and flash its row,
// even after the table was sorted; links to a run (from the trial table) open its section.
(function () {
  "use strict";
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var headers = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(headers, function (th, col) {
      th.addEventListener("click", function () {
        var asc = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(headers, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", asc ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[col], y = b.cells[col];
          var xv = x.dataset.v, yv = y.dataset.v, r;
          if (xv !== undefined || yv !== undefined) {
            // Missing numbers sort last in either direction.
            if (xv === undefined) return 1;
            if (yv === undefined) return -1;
            r = parseFloat(xv) - parseFloat(yv);
          } else {
            r = x.textContent.localeCompare(y.textContent, undefined, {numeric: true});
          }
          return asc ? r : -r;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
  function flash() {
    var id = decodeURIComponent(location.hash.slice(1));
    var row = id && document.getElementById(id);
    if (row && row.tagName === "DETAILS") {  // a run's section: open it and show it
      row.open = true;
      row.scrollIntoView({block: "start"});
      row.classList.add("flash");
      setTimeout(function () { row.classList.remove("flash"); }, 2500);
      return;
    }
    if (!row || row.tagName !== "TR") return;
    row.scrollIntoView({block: "center"});
    row.classList.add("flash");
    setTimeout(function () { row.classList.remove("flash"); }, 2500);
  }
  window.addEventListener("hashchange", flash);
  flash();
})();
