// Shared helpers for the dashboard pages: fetching, live polling, DOM and chart helpers.
// No framework: each page renders plain DOM from its JSON and re-renders on change.
"use strict";

const UI = {
  POLL_MS: 1000,

  async get(url) {
    const r = await fetch(url, { credentials: "same-origin" });
    if (!r.ok) throw new Error(`${url}: HTTP ${r.status} ${await r.text()}`);
    return r.json();
  },

  // Fetch `url` now and then every POLL_MS with ?since=<revision>; call render(data)
  // whenever the server reports a new revision (a live search updates the page).
  live(url, render) {
    let revision = null;
    const status = document.getElementById("live");
    const tick = async () => {
      try {
        const sep = url.includes("?") ? "&" : "?";
        const q = revision === null ? url : `${url}${sep}since=${encodeURIComponent(revision)}`;
        const data = await UI.get(q);
        if (!data.unchanged) {
          render(data);
          revision = data.revision;  // after render: one that threw is fetched again
          if (status) status.dataset.revision = revision;
        }
        if (status) status.textContent = "live · updated " + new Date().toLocaleTimeString();
        UI.clearError();  // the store answers again: a 503 or "Failed to fetch" is over
      } catch (e) {
        UI.error(e);
      }
      setTimeout(tick, UI.POLL_MS);
    };
    tick();
  },

  error(e) {
    const box = document.getElementById("error");
    if (box) { box.textContent = String(e.message || e); box.hidden = false; }
  },

  clearError() {
    const box = document.getElementById("error");
    if (box && !box.hidden) { box.hidden = true; box.textContent = ""; }
  },

  // el("td", {class: "x", dataset: {trial: 3}}, "text", childNode, ...)
  el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "dataset") Object.assign(node.dataset, v);
      else if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  },

  link(href, text) { return UI.el("a", { href }, text); },

  fmt(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "number") {
      if (Number.isInteger(v)) return String(v);
      return String(parseFloat(v.toPrecision(6)));
    }
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  },

  // The API spells NaN and the infinities as the strings "NaN", "Infinity", "-Infinity"
  // (JSON has no literal for them; null is a value that is missing, not a diverged one).
  nonfinite(v) { return v === "NaN" || v === "Infinity" || v === "-Infinity"; },
  num(v) { return UI.nonfinite(v) ? Number(v) : v; },
  // A metric as text: NaN, +inf, -inf for a diverged value, "–" for a missing one.
  metricText(v) {
    if (!UI.nonfinite(v)) return UI.fmt(v);
    return v === "NaN" ? "NaN" : v === "Infinity" ? "+inf" : "-inf";
  },
  // A metric for a table cell: a diverged value is marked (span.diverged) and says so.
  metric(v) {
    if (!UI.nonfinite(v)) return UI.fmt(v);
    const text = UI.metricText(v);
    return UI.el("span", { class: "diverged", title: `diverged: the trial reported ${text}` }, text);
  },
  // A chart point's y: none (a gap) for a non-finite value, which no axis can place.
  y(v) { return typeof v === "number" && Number.isFinite(v) ? v : null; },

  state(s) { return UI.el("span", { class: `state state-${String(s).toLowerCase()}` }, s); },

  // headers: "name", or "#name" for a right-aligned numeric column.
  table(headers, rows, attrs) {
    const t = UI.el("table", attrs || {});
    const th = (h) => h.startsWith("#") ? UI.el("th", { class: "num" }, h.slice(1)) : UI.el("th", {}, h);
    t.append(UI.el("thead", {}, UI.el("tr", {}, ...headers.map(th))));
    const body = UI.el("tbody", {});
    for (const r of rows) body.append(r);
    t.append(body);
    return t;
  },

  replace(id, ...nodes) {
    const box = document.getElementById(id);
    box.replaceChildren(...nodes);
    return box;
  },

  COLORS: ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"],
  color(i) { return UI.COLORS[i % UI.COLORS.length]; },

  // Create the Chart.js chart on canvas#id once; later calls replace its data in place
  // (no flicker, no animation: the page is also read by tests).
  chart(id, type, datasets, xTitle, yTitle) {
    const existing = Chart.getChart(id);
    if (existing) {
      existing.data.datasets = datasets;
      existing.update("none");
      return existing;
    }
    return new Chart(document.getElementById(id), {
      type,
      data: { datasets },
      options: {
        animation: false,
        parsing: true,
        maintainAspectRatio: false,
        interaction: { mode: "nearest", intersect: false },
        plugins: { legend: { display: datasets.length <= 12, position: "right" } },
        scales: {
          x: { type: "linear", title: { display: true, text: xTitle } },
          y: { title: { display: true, text: yTitle } },
        },
      },
    });
  },
};
