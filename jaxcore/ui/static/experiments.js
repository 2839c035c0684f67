// Experiments list: state, searcher, best metric and progress of every experiment.
"use strict";

function progressCell(p) {
  const frac = p.expected ? Math.min(1, p.done / p.expected) : 0;
  const bar = UI.el("span", { class: "progress" }, UI.el("i", { style: `width:${(frac * 100).toFixed(0)}%` }));
  return UI.el("td", { class: "progress-cell" }, bar, `${p.done}/${p.expected} trials`);
}

function renderExperiments(data) {
  document.getElementById("store").textContent = `store: ${data.store}`;
  if (!data.experiments.length) {
    UI.replace("list", UI.el("p", { class: "muted" },
      "No experiments yet: start one with 'jaxcore experiment create CONFIG.yaml'; it appears here live."));
    return;
  }
  const rows = data.experiments.map((e) => UI.el("tr", { dataset: { experiment: e.id } },
    UI.el("td", {}, UI.link(`/experiments/${e.id}`, `#${e.id}`)),
    UI.el("td", { class: "name" }, UI.link(`/experiments/${e.id}`, e.name)),
    UI.el("td", { class: "state" }, UI.state(e.state)),
    UI.el("td", { class: "searcher" }, e.searcher || "–"),
    UI.el("td", {}, `${e.metric || "–"} ${e.smaller_is_better ? "↓" : "↑"}`),
    UI.el("td", { class: "num best" }, UI.metric(e.best_metric)),
    progressCell(e.progress),
    UI.el("td", { class: "num trials" }, e.trials),
    UI.el("td", { class: "muted" }, Object.entries(e.trials_by_state).map(([s, n]) => `${s} ${n}`).join(", ")),
    UI.el("td", { class: "muted" }, (e.created || "").replace("T", " ").slice(0, 19)),
  ));
  UI.replace("list", UI.table(
    ["id", "name", "state", "searcher", "metric", "#best", "progress", "#trials", "by state", "created"],
    rows, { id: "experiments" }));
}

UI.live("/api/experiments", renderExperiments);
