// Chronos console: refresh the overview every second from /api/overview, copying text only
// (textContent, never HTML) except for the charts, which the server renders as SVG.
"use strict";
(function () {
  const root = document.getElementById("live");
  if (!root) return;
  const source = root.dataset.src;
  let busy = false;

  function apply(data) {
    const shown = data.display || {};
    root.querySelectorAll("[data-field]").forEach(function (el) {
      const name = el.dataset.field;
      if (Object.prototype.hasOwnProperty.call(shown, name)) el.textContent = shown[name];
    });
    const error = document.getElementById("store-error");
    if (error) error.hidden = !data.store_error;
    const stalled = document.getElementById("publishing-stalled");
    if (stalled) stalled.hidden = !data.publishing_stalled;
    const apart = document.getElementById("postgres-apart");
    if (apart) apart.hidden = !data.postgres_apart;
    root.querySelectorAll("[data-rows]").forEach(function (table) {
      const body = table.querySelector("tbody");
      const rows = (data[table.dataset.rows] || []).map(function (cells) {
        const tr = document.createElement("tr");
        cells.forEach(function (cell) {
          const td = document.createElement("td");
          td.textContent = cell;
          tr.appendChild(td);
        });
        return tr;
      });
      body.replaceChildren.apply(body, rows);
    });
    root.querySelectorAll("[data-chart]").forEach(function (box) {
      const svg = (data.charts || {})[box.dataset.chart];
      if (typeof svg === "string") box.innerHTML = svg;
    });
    root.dataset.refreshed = String(Date.now());
  }

  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const response = await fetch(source, {cache: "no-store", credentials: "same-origin"});
      if (response.ok) apply(await response.json());
    } catch (e) {
      // the console or the network is down: keep the last figures, try again next second
    } finally {
      busy = false;
    }
  }

  setInterval(refresh, 1000);
})();
