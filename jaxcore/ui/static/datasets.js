// Datasets: each 'data build' output directory's versions, per-stage kept/dropped counts,
// languages, licenses, and the diff between two versions.
"use strict";

function counts(title, obj, cls) {
  return UI.el("div", { class: cls },
    UI.el("h3", {}, title),
    UI.table(["name", "#files"], Object.entries(obj).map(([k, v]) =>
      UI.el("tr", {}, UI.el("td", {}, k), UI.el("td", { class: "num" }, v)))));
}

function versionCard(ds, v) {
  return UI.el("div", { class: "card version", id: `${ds.name}/${v.version}`, dataset: { version: v.version } },
    UI.el("h3", {}, `${ds.name} ${v.version}`, " ",
      UI.el("span", { class: "muted" }, `${v.inputs.files} files in, ${v.outputs.files} kept, ${v.dropped.files} dropped`)),
    UI.table(["stage", "#files in", "#kept", "#dropped", "top drop reasons"], v.stages.map((s) =>
      UI.el("tr", { dataset: { stage: s.name } },
        UI.el("td", {}, s.name), UI.el("td", { class: "num" }, s.files_in),
        UI.el("td", { class: "num kept" }, s.kept), UI.el("td", { class: "num dropped" }, s.dropped),
        UI.el("td", { class: "muted" }, Object.entries(s.reasons).sort((a, b) => b[1] - a[1]).slice(0, 4)
          .map(([k, n]) => `${k}=${n}`).join(", ")))), { class: "stages" }),
    UI.el("div", { class: "charts" },
      counts("languages", v.languages, "languages"),
      UI.el("div", {}, counts("license types", v.licenses, "licenses"),
        counts("license ids", v.license_ids, "license-ids"))));
}

async function showDiff(ds, box, a, b) {
  box.replaceChildren("diffing…");
  try {
    const d = await UI.get(`/api/datasets/${encodeURIComponent(ds.name)}/diff?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`);
    box.replaceChildren(...["added", "removed", "changed"].map((k) => UI.el("div", { class: `diff-${k}` },
      UI.el("h3", {}, `${k}: `, UI.el("span", { class: "count" }, d[k].count)),
      UI.el("ul", {}, ...d[k].files.map((f) => UI.el("li", {}, f))))));
  } catch (e) {
    box.replaceChildren(String(e.message || e));
  }
}

function diffCard(ds) {
  const names = ds.versions.map((v) => v.version);
  const pick = (id, sel) => {
    const s = UI.el("select", { class: id }, ...names.map((n) => UI.el("option", { value: n }, n)));
    s.value = sel;
    return s;
  };
  const a = pick("diff-a", names[names.length - 2]), b = pick("diff-b", names[names.length - 1]);
  const box = UI.el("div", { class: "diff" });
  const button = UI.el("button", { class: "diff-run" }, "diff");
  button.onclick = () => showDiff(ds, box, a.value, b.value);
  showDiff(ds, box, a.value, b.value);
  return UI.el("div", { class: "card" }, UI.el("h2", {}, "Diff ", a, " → ", b, " ", button), box);
}

async function main() {
  const d = await UI.get("/api/datasets");
  if (!d.datasets.length) {
    UI.replace("datasets", UI.el("p", { class: "muted" },
      "No dataset directories: start the dashboard with --datasets OUTPUT_DIR (a 'data build' output_dir)."));
    return;
  }
  UI.replace("datasets", ...d.datasets.map((ds) => UI.el("section", { class: "dataset", dataset: { dataset: ds.name } },
    UI.el("h2", {}, ds.name, " ", UI.el("span", { class: "muted" }, ds.root)),
    UI.table(["version", "#files in", "#kept", "#dropped", "#MB kept", "#opt-out registry"], ds.versions.map((v) =>
      UI.el("tr", { dataset: { version: v.version } },
        UI.el("td", {}, UI.link(`#${ds.name}/${v.version}`, v.version)),
        UI.el("td", { class: "num" }, v.inputs.files), UI.el("td", { class: "num kept" }, v.outputs.files),
        UI.el("td", { class: "num dropped" }, v.dropped.files),
        UI.el("td", { class: "num" }, (v.outputs.bytes / 1e6).toFixed(2)),
        UI.el("td", { class: "num" }, UI.fmt(v.optout_registry_version)))), { class: "versions" }),
    ...(ds.damaged || []).map((d) => UI.el("p", { class: "damaged", dataset: { version: d.version } },
      `${d.version} is left out: ${d.error}`)),
    ds.versions.length >= 2 ? diffCard(ds) : null,
    ...ds.versions.map((v) => versionCard(ds, v)))));
}

main().catch(UI.error);
