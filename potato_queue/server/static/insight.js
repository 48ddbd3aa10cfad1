// A run's page, once it succeeded: good enough to prelabel with (per label, reliability, a min_confidence for a
// precision), will more labels help (the learning curve), what to label next (and Potato's copy of the order),
// and a comparison with another run. Everything comes from the insight routes (potato_queue/insight/).
"use strict";
(function () {
  const RUN_ID = document.getElementById("run").dataset.run;
  const base = "/runs/" + RUN_ID;
  const SVG = "http://www.w3.org/2000/svg";
  // Scores get three decimals; a count is given as text (String(n)) where it is made.
  const fmt = (v) => (v === null || v === undefined ? "-" : typeof v === "number" ? v.toFixed(3) : String(v));

  function node(tag, attrs, text) {
    const n = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    return n;
  }

  function table(head, rows, cls) {
    return el("table", {class: cls || null}, el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {text: h})))),
      el("tbody", {}, ...rows.map((r) => el("tr", {}, ...r.map((c) => el("td", {text: fmt(c)}))))));
  }

  // A square chart with axes 0..1 (or xs given), points joined per series; `diagonal` draws y = x.
  function chart(series, opts) {
    const W = 360, H = 260, P = 40;
    const xs = series.flatMap((s) => s.points.map((p) => p[0]));
    const [x0, x1] = opts.x || [Math.min(...xs), Math.max(...xs)];
    const X = (v) => P + (v - x0) / ((x1 - x0) || 1) * (W - 2 * P), Y = (v) => H - P - v * (H - 2 * P);
    const svg = node("svg", {viewBox: `0 0 ${W} ${H}`, width: "100%", class: "chart " + (opts.cls || "")});
    svg.append(node("line", {x1: P, y1: H - P, x2: W - P, y2: H - P, class: "axis"}),
      node("line", {x1: P, y1: P, x2: P, y2: H - P, class: "axis"}),
      node("text", {x: 2, y: P + 4, class: "tick"}, "1.0"), node("text", {x: 2, y: H - P, class: "tick"}, "0.0"),
      node("text", {x: P, y: H - 8, class: "tick"}, opts.xLabel + " " + x0), node("text", {x: W - P - 40, y: H - 8, class: "tick"}, String(x1)));
    if (opts.diagonal) svg.append(node("line", {x1: X(0), y1: Y(0), x2: X(1), y2: Y(1), class: "axis diagonal"}));
    series.forEach((s, k) => {
      svg.append(node("polyline", {points: s.points.map(([a, b]) => X(a) + "," + Y(b)).join(" "), class: "series s" + k}));
      for (const [a, b, tip] of s.points) {
        const dot = node("circle", {cx: X(a), cy: Y(b), r: 4, class: "point s" + k, "data-series": s.name});
        dot.append(node("title", {}, tip || `${s.name}: ${fmt(b)} at ${a}`));
        svg.append(dot);
      }
    });
    return el("div", {}, svg, el("ul", {class: "legend"}, ...series.map((s, k) => el("li", {class: "s" + k, text: s.name}))));
  }

  function thresholdSaid(schema, th, target) {
    return th.min_confidence === null
      ? `${schema}: no min_confidence keeps precision at ${target} on its ${th.of} held-out items.`
      : `${schema}: min_confidence ${th.min_confidence} keeps precision at ${fmt(th.precision)} (target ${target}): it would ` +
        `prelabel ${th.kept} of the ${th.of} held-out items. Not applied: set model_training.writeback.min_confidence to use it.`;
  }

  async function quality() {
    const target = Number(document.getElementById("target-precision").value) || 0.9;
    const found = await api(base + "/quality?target_precision=" + target);
    const said = [], tables = [], charts = [];
    for (const [schema, q] of Object.entries(found.schemas)) {
      said.push(el("span", {text: thresholdSaid(schema, q.threshold, target) + " "}));
      tables.push(el("h3", {text: schema}), table(["Label", "Precision", "Recall", "F1", "Items"],
        q.per_label.map((r) => [r.label, r.precision, r.recall, r.f1, String(r.support)])));
      const bins = q.reliability.bins.filter((b) => b.n);
      if (bins.length) charts.push(chart([{name: "accuracy by confidence (" + schema + ")",
        points: bins.map((b) => [b.confidence, b.accuracy, `${b.n} items at confidence ${b.lo}-${b.hi}: accuracy ${fmt(b.accuracy)}`])}],
      {x: [0, 1], xLabel: "confidence", diagonal: true, cls: "reliability"}),
      el("p", {class: "hint", text: "On the diagonal a prediction is right as often as it is sure. Expected calibration error " + fmt(q.reliability.ece)}));
    }
    document.getElementById("threshold").replaceChildren(...said);
    document.getElementById("per-label").replaceChildren(...tables);
    document.getElementById("reliability").replaceChildren(...charts);
    document.getElementById("quality").hidden = false;
  }

  async function curve() {
    let found;
    try { found = await api(base + "/curve"); } catch (err) { return; } // a run without a curve: the section stays hidden
    const said = [], charts = [];
    for (const [schema, c] of Object.entries(found.schemas)) {
      // macro-F1; a slider's curve (it has no classes) is its MAE
      const [key, name] = c.points.some((p) => typeof p.test_macro_f1 === "number" || typeof p.val_macro_f1 === "number")
        ? ["macro_f1", "macro-F1"] : ["mae", "MAE"];
      const series = ["test", "val"].map((split) => ({name: `${split} ${name} (${schema})`,
        points: c.points.filter((p) => typeof p[split + "_" + key] === "number")
          .map((p) => [p.n_train, p[split + "_" + key], `${p.percent} % (${p.n_train} items): ${split} ${name} ${fmt(p[split + "_" + key])}`])}))
        .filter((s) => s.points.length);
      said.push(el("span", {text: schema + ": " + c.said + ". "}));
      if (series.length) charts.push(chart(series, {xLabel: "train items", cls: "curve"}));
    }
    document.getElementById("curve-said").replaceChildren(...said);
    document.getElementById("curve-chart").replaceChildren(...charts);
    document.getElementById("curve").hidden = false;
  }

  async function next() {
    const found = await api(base + "/next?limit=20");
    document.getElementById("next-said").textContent = found.said;
    document.getElementById("next-items").replaceChildren(table(["#", "Item", "Uncertainty", "Predicted", "Text"],
      found.items.map((i) => [String(i.rank), i.instance_id, i.uncertainty, Object.values(i.predicted).join(", "), i.text])));
    document.getElementById("to-potato").hidden = !found.items.length;
    document.getElementById("next").hidden = false;
  }

  async function toPotato() {
    const said = document.getElementById("to-potato-said");
    said.textContent = "";
    try {
      const done = await api(base + "/next/potato", {method: "POST"});
      said.className = done.problem ? "problem" : "";
      said.textContent = done.said;
    } catch (err) { said.className = "problem"; said.textContent = err.message; }
  }

  function confusionTable(c) {
    return table(["gold \\ predicted", ...c.columns], c.labels.map((label, g) => [label, ...c.counts[g].map(String)]), "confusion");
  }

  async function compareWith(other) {
    const box = document.getElementById("compared");
    if (!other) { box.replaceChildren(); return; }
    let found;
    try { found = await api(base + "/compare/" + other); } catch (err) { box.replaceChildren(el("p", {class: "problem", text: err.message})); return; }
    const parts = [];
    for (const [schema, s] of Object.entries(found.schemas)) {
      const a = Object.fromEntries(s.a.per_label.map((r) => [r.label, r]));
      const b = Object.fromEntries(s.b.per_label.map((r) => [r.label, r]));
      const labels = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
      parts.push(el("h3", {text: `${schema}: ${s.n} held-out items both scored`}), el("p", {class: "said", text: s.said}),
        table(["", "This run (A)", "Run " + found.b + " (B)"], [["accuracy", "accuracy"], ["macro_f1", "macro-F1"], ["micro_f1", "micro-F1"],
          ["mae", "MAE"], ["spearman", "Spearman"], ["qwk", "QWK"]].filter(([k]) => k in s.a).map(([k, name]) => [name, s.a[k], s.b[k]])),
        table(["Label", "Precision A", "Recall A", "F1 A", "Precision B", "Recall B", "F1 B", "Items"],
          labels.map((l) => [l, ...[a[l] || {}, b[l] || {}].flatMap((r) => [r.precision, r.recall, r.f1]), String((a[l] || b[l]).support)])),
        el("p", {text: `McNemar (${s.mcnemar.method}): A right where B is wrong ${s.mcnemar.only_a}, B right where A is wrong ${s.mcnemar.only_b}, p = ${s.mcnemar.p_value}`}),
        el("div", {class: "row"}, el("div", {}, el("h4", {text: "A"}), confusionTable(s.a.confusion)), el("div", {}, el("h4", {text: "B"}), confusionTable(s.b.confusion))),
        el("h4", {text: `Where they disagree (${s.disagree})`}),
        table(["Item", "Annotators' label", "A", "B", "Each annotator", "Text"], s.disagreements.map((d) =>
          [d.instance_id, d.gold, d.a, d.b, Object.entries(d.annotators).map(([u, l]) => u + ": " + l).join(", ") || "-", d.text]), "disagreements"));
    }
    if (found.reproducibility) {
      parts.push(el("h3", {text: "What made the two runs"}), found.reproducibility.length
        ? table(["Differs", "This run (A)", "Run " + found.b + " (B)"], found.reproducibility.map((d) => [d.field, JSON.stringify(d.a), JSON.stringify(d.b)]), "made-differently")
        : el("p", {id: "made-same", text: "Made the same way: code, data, trainer, params, seeds, packages, GPUs, backend and host."}));
    }
    box.replaceChildren(...parts);
  }

  async function others() {
    const runs = await api("/runs?limit=200");
    const select = document.getElementById("compare-with");
    const choices = runs.filter((r) => r.run_id !== RUN_ID && r.state === "succeeded");
    select.replaceChildren(el("option", {value: "", text: choices.length ? "pick a run" : "no other succeeded run"}),
      ...choices.map((r) => el("option", {value: r.run_id, text: `${r.run_id} (${r.trainer} on ${r.ran_on || r.backend})`})));
    document.getElementById("compare").hidden = false;
    return choices;
  }

  async function start() {
    let run;
    try { run = await api(base); } catch (err) { setTimeout(start, 3000); return; }
    if (!["succeeded", "failed", "cancelled"].includes(run.state)) { setTimeout(start, 2000); return; }
    if (run.state !== "succeeded") return;
    const [, , , choices] = await Promise.all([quality(), curve(), next(), others()].map((p) => p.catch((err) => console.warn(err))));
    // A re-run is compared with the run it repeats at once: that is what it was made for.
    if (run.rerun_of && (choices || []).some((r) => r.run_id === run.rerun_of)) {
      document.getElementById("compare-with").value = run.rerun_of;
      await compareWith(run.rerun_of);
    }
  }

  document.getElementById("target-precision").addEventListener("change", () => quality().catch(() => {}));
  document.getElementById("to-potato").addEventListener("click", toPotato);
  document.getElementById("compare-with").addEventListener("change", (e) => compareWith(e.target.value));
  start();
})();
