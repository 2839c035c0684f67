// Model registry: models, versions, aliases, metrics, and each version's lineage back
// through checkpoint -> trial -> experiment -> dataset version (where recorded).
"use strict";

function datasetLink(path, roots) {
  if (!path) return UI.el("span", { class: "muted" }, "not recorded");
  for (const [name, root] of Object.entries(roots)) {
    if (path.startsWith(root + "/")) {
      const version = path.slice(root.length + 1).split("/")[0];
      return UI.link(`/datasets#${name}/${version}`, `${name} ${version}`);
    }
  }
  return UI.el("span", {}, path);
}

// Read left to right the way the version came to be: dataset -> experiment -> trial ->
// checkpoint (-> this version).
function lineage(l, roots) {
  const parts = ["dataset ", datasetLink(l.dataset, roots)];
  if (l.experiment !== undefined) parts.push(" → ", UI.link(`/experiments/${l.experiment}`, `experiment #${l.experiment}`));
  if (l.trial !== undefined) parts.push(" → ", UI.link(`/trials/${l.trial}`, `trial #${l.trial}`));
  if (l.checkpoint !== null && l.checkpoint !== undefined) parts.push(" → ", `checkpoint #${l.checkpoint} (step ${UI.fmt(l.step)})`);
  return UI.el("td", { class: "lineage" }, ...parts);
}

async function main() {
  const d = await UI.get("/api/models");
  if (!d.models.length) {
    UI.replace("models", UI.el("p", { class: "muted" },
      "No registered models: 'jaxcore model create NAME' then 'jaxcore model register'."));
    return;
  }
  UI.replace("models", ...d.models.map((m) => UI.el("div", { class: "card model", dataset: { model: m.name } },
    UI.el("h2", {}, m.name, " ", UI.el("span", { class: "muted" }, m.description || "")),
    UI.el("p", { class: "muted" }, "aliases: " + (Object.entries(m.aliases).map(([a, v]) => `${a} → v${v}`).join(", ") || "none")),
    UI.table(["version", "aliases", "metrics", "lineage", "created"], m.versions.map((v) =>
      UI.el("tr", { dataset: { version: v.version } },
        UI.el("td", {}, `v${v.version}`),
        UI.el("td", { class: "aliases" }, v.aliases.join(", ")),
        UI.el("td", { class: "metrics" }, Object.entries(v.metrics).map(([k, x]) => `${k}=${UI.metricText(x)}`).join(", ")),
        lineage(v.lineage, d.datasets),
        UI.el("td", { class: "muted" }, (v.created || "").replace("T", " ").slice(0, 19))))),
  )));
}

main().catch(UI.error);
