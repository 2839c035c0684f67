// One trial: its metric curves, hyperparameters, checkpoints (with metrics), restarts,
// preemptions and the tail of its log file.
"use strict";

const TRIAL_ID = location.pathname.split("/").filter(Boolean).pop();

function render(d) {
  document.title = `trial ${d.id} · jaxcore`;
  UI.replace("title", "Trial #" + d.id + " of ",
    UI.link(`/experiments/${d.experiment_id}`, `experiment #${d.experiment_id} (${d.experiment_name})`));
  const items = [
    ["state", UI.state(d.state)], ["steps", `${UI.fmt(d.steps_done)}/${UI.fmt(d.max_length)}`],
    [`best ${d.metric || "metric"}`, UI.el("b", { id: "best-metric" }, UI.metric(d.best_metric))],
    ["restarts", UI.el("b", { id: "restarts" }, d.restarts)],
    d.preemptions === null || d.preemptions === undefined
      ? ["last run preempted", UI.el("b", { id: "preempted" }, d.preempted_last_exit ? "yes (exit 75)" : "no")]
      : ["preemptions", UI.el("b", { id: "preemptions" }, d.preemptions)],
    ["last exit code", UI.fmt(d.exit_code)],
    ["parent (PBT exploit)", d.parent_trial ? UI.link(`/trials/${d.parent_trial}`, `#${d.parent_trial}`) : "–"],
  ];
  UI.replace("facts", ...items.map(([k, v]) => UI.el("div", {}, UI.el("span", {}, k), v)));
  for (const kind of ["validation", "training"]) {
    const series = d.series[kind] || {};
    const datasets = Object.keys(series).sort().map((name, i) => ({
      label: name, data: series[name].map(([x, y]) => ({ x, y: UI.y(y) })),
      borderColor: UI.color(i), backgroundColor: UI.color(i), borderWidth: 1.5,
      pointRadius: series[name].length > 30 ? 0 : 2,
    }));
    UI.chart(`curve-${kind}`, "line", datasets, "step", kind);
  }
  UI.replace("hparams", UI.table(["name", "#value"], Object.entries(d.hparams).map(([k, v]) =>
    UI.el("tr", {}, UI.el("td", {}, k), UI.el("td", { class: "num" }, UI.fmt(v))))));
  UI.replace("checkpoints", d.checkpoints.length ? UI.table(
    ["#id", "#step", "state", "metrics", "format", "path"],
    d.checkpoints.map((c) => UI.el("tr", { dataset: { checkpoint: c.id } },
      UI.el("td", {}, c.id), UI.el("td", { class: "num" }, c.step), UI.el("td", {}, UI.state(c.state)),
      UI.el("td", {}, Object.entries(c.metrics || {}).map(([k, v]) => `${k}=${UI.metricText(v)}`).join(", ")),
      UI.el("td", {}, c.format), UI.el("td", { class: "muted" }, c.path))),
    { id: "checkpoints-table" }) : UI.el("p", { class: "muted" }, "no checkpoints"));
  const logs = document.getElementById("logs");
  logs.textContent = d.logs || "(no log output)";
}

UI.live(`/api/trials/${TRIAL_ID}`, render);
