// One experiment: facts, all trials' curves on one chart, hyperparameter-vs-metric
// scatter, ASHA rungs or the PBT exploit/explore lineage, and the trials table.
"use strict";

const EXP_ID = location.pathname.split("/").filter(Boolean).pop();
let current = null;

function facts(d) {
  const items = [
    ["state", UI.state(d.state)], ["searcher", d.searcher || "–"],
    ["metric", `${d.metric || "–"} ${d.smaller_is_better ? "(lower is better)" : "(higher is better)"}`],
    ["best metric", UI.el("b", { id: "best-metric" }, UI.metric(d.best_metric))],
    ["best trial", d.best_trial ? UI.link(`/trials/${d.best_trial}`, `#${d.best_trial}`) : "–"],
    ["trials", UI.el("b", { id: "trial-count" }, d.trials)],
    ["progress", `${d.progress.done}/${d.progress.expected} trials done`],
    ["created", (d.created || "").replace("T", " ").slice(0, 19)],
  ];
  UI.replace("facts", ...items.map(([k, v]) => UI.el("div", {}, UI.el("span", {}, k), v)));
}

function curves(d) {
  const ids = Object.keys(d.curves).sort((a, b) => a - b);
  const datasets = ids.map((id, i) => ({
    label: `trial ${id}` + (d.curves[id].some(([, y]) => UI.nonfinite(y)) ? " (diverged)" : ""),
    trialId: Number(id),
    data: d.curves[id].map(([x, y]) => ({ x, y: UI.y(y) })),
    borderColor: UI.color(i), backgroundColor: UI.color(i), borderWidth: 1.5,
    pointRadius: d.curves[id].length > 30 ? 0 : 2,
  }));
  UI.chart("curves", "line", datasets, "step", d.metric || "metric");
}

function scatter(d) {
  const select = document.getElementById("hparam");
  const numeric = d.hparam_names.filter((n) => d.trials_detail.some((t) => typeof t.hparams[n] === "number"));
  if (select.options.length !== numeric.length) {
    select.replaceChildren(...numeric.map((n) => UI.el("option", { value: n }, n)));
    select.onchange = () => scatter(current);
  }
  if (!numeric.length) {
    UI.chart("scatter", "scatter", [], "no numeric hyperparameter", d.metric || "metric");
    return;
  }
  const name = select.value || numeric[0];
  const pts = d.trials_detail
    .filter((t) => typeof t.hparams[name] === "number" && UI.y(t.best_metric ?? t.latest_metric) !== null)
    .map((t) => ({ x: t.hparams[name], y: t.best_metric ?? t.latest_metric, trial: t.id }));
  UI.chart("scatter", "scatter", [{ label: `${name} vs ${d.metric}`, data: pts, pointRadius: 4,
    backgroundColor: UI.color(0) }], name || "hyperparameter", d.metric || "metric");
}

function trialsTable(d) {
  const rows = d.trials_detail.map((t) => UI.el("tr", {
      dataset: { trial: t.id, points: (d.curves[t.id] || []).length },
      class: t.id === d.best_trial ? "best" : "" },
    UI.el("td", {}, UI.link(`/trials/${t.id}`, `#${t.id}`)),
    UI.el("td", {}, UI.state(t.state)),
    ...d.hparam_names.map((n) => UI.el("td", { class: "num" }, UI.fmt(t.hparams[n]))),
    UI.el("td", { class: "num" }, `${UI.fmt(t.steps_done)}/${UI.fmt(t.max_length)}`),
    UI.el("td", { class: "num best" }, UI.metric(t.best_metric)),
    UI.el("td", { class: "num latest" }, UI.metric(t.latest_metric)),
    UI.el("td", { class: "num" }, UI.fmt(t.restarts)),
    UI.el("td", {}, t.parent_trial ? UI.link(`/trials/${t.parent_trial}`, `#${t.parent_trial}`) : ""),
  ));
  UI.replace("trials", UI.table(
    ["trial", "state", ...d.hparam_names.map((n) => "#" + n), "#steps", "#best", "#latest", "#restarts", "parent"],
    rows, { id: "trials-table" }));
}

function ashaRungs(brackets) {
  return brackets.map((b, i) => UI.el("div", { class: "bracket", dataset: { bracket: i } },
    UI.el("h3", {}, `bracket ${i + 1}: ${b.trials} trials, rungs at ${b.units.join(", ")} steps`),
    UI.table(["#rung (steps)", "#reported", "#promoted", "trials, best first (green: went on)"],
      b.rungs.map((r) => UI.el("tr", { dataset: { rung: r.units } },
        UI.el("td", { class: "num" }, r.units),
        UI.el("td", { class: "num reported" }, r.trials.length),
        UI.el("td", { class: "num promoted" }, r.trials.filter((t) => t.promoted).length),
        UI.el("td", { class: "chips" }, ...r.trials.map((t) => UI.el("a", {
          class: "chip" + (t.promoted ? " promoted" : ""), href: `/trials/${t.trial}`,
          title: `metric ${UI.metricText(t.metric)}` }, `#${t.trial} ${UI.metricText(t.metric)}`))),
      ))),
  ));
}

// PBT lineage: one bar per trial over the rounds it trained, an arrow from the parent it
// exploited (copied the checkpoint of) to the child, labelled with what explore changed.
function pbtLineage(p, bestTrial) {
  const NS = "http://www.w3.org/2000/svg";
  const W = 140, H = 22, PAD = 60;
  const nodes = [...p.nodes].sort((a, b) => a.first_round - b.first_round || a.trial - b.trial);
  const row = new Map(nodes.map((n, i) => [n.trial, i]));
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("id", "lineage");
  svg.setAttribute("width", PAD + p.rounds * W + 20);
  svg.setAttribute("height", 30 + nodes.length * H);
  const mk = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
    return e;
  };
  const defs = mk("defs", {});
  const marker = document.createElementNS(NS, "marker");
  for (const [k, v] of Object.entries({ id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5,
      markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" })) marker.setAttribute(k, v);
  const tip = document.createElementNS(NS, "path");
  tip.setAttribute("d", "M 0 0 L 10 5 L 0 10 z");
  tip.setAttribute("fill", "#d62728");
  marker.append(tip);
  defs.append(marker);
  for (let r = 1; r <= p.rounds; r++) mk("text", { x: PAD + (r - 1) * W + 4, y: 12 }, `round ${r}`);
  const y = (trial) => 24 + row.get(trial) * H;
  for (const n of nodes) {
    mk("text", { x: 4, y: y(n.trial) + 13 }, `#${n.trial}`);
    const rect = mk("rect", { class: "node" + (n.trial === bestTrial ? " best" : ""),
      x: PAD + (n.first_round - 1) * W, y: y(n.trial) + 2, rx: 3,
      width: (n.last_round - n.first_round + 1) * W - 6, height: H - 6, "data-trial": n.trial });
    rect.append(Object.assign(document.createElementNS(NS, "title"),
      { textContent: `trial ${n.trial}: ${JSON.stringify(n.hparams)}` }));
  }
  for (const e of p.edges) {
    if (!row.has(e.parent) || !row.has(e.child)) continue;
    const x = PAD + (e.round - 1) * W;
    const path = mk("path", { class: "edge", "data-parent": e.parent, "data-child": e.child,
      d: `M ${x - 8} ${y(e.parent) + 11} C ${x - 2} ${y(e.parent) + 11}, ${x - 14} ${y(e.child) + 11}, ${x} ${y(e.child) + 11}` });
    const change = Object.entries(e.explore).map(([k, [a, b]]) => `${k} ${UI.fmt(a)}→${UI.fmt(b)}`).join(", ");
    path.append(Object.assign(document.createElementNS(NS, "title"),
      { textContent: `exploit #${e.parent} → #${e.child}; explore: ${change}` }));
    mk("text", { x: x + 4, y: y(e.child) + 14, class: "explore" }, change);
  }
  return svg;
}

function render(d) {
  current = d;
  document.title = `${d.name} · jaxcore`;
  UI.replace("title", `Experiment #${d.id}: ${d.name}`);
  facts(d);
  curves(d);
  scatter(d);
  trialsTable(d);
  const section = document.getElementById("search-section");
  if (d.asha) {
    section.hidden = false;
    UI.replace("search-title", "ASHA rungs");
    UI.replace("search", ...ashaRungs(d.asha));
  } else if (d.pbt) {
    section.hidden = false;
    UI.replace("search-title", "PBT generations: exploit (arrows) and explore (labels)");
    UI.replace("search", pbtLineage(d.pbt, d.best_trial));
  }
}

UI.live(`/api/experiments/${EXP_ID}`, render);
