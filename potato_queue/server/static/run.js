// A run's page: its facts, run.log as it grows, the metrics chart, its predictions.
"use strict";
const RUN = document.getElementById("run").dataset.run;
let logOffset = 0, eventsSeen = 0, finished = false;
const metrics = [];
const NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

async function refresh() {
  const run = await api("/runs/" + RUN);
  document.getElementById("state").textContent = run.state;
  const facts = document.getElementById("facts");
  const rows = [["Ran on", run.ran_on], ["Trainer", run.trainer], ["Schemas", (run.schemas || []).join(", ")],
    ["Params", JSON.stringify(run.params || {})], ["Trigger", run.trigger], ["Duration", duration(run)],
    ["Model (artifact_uri)", run.artifact_uri], ["Held-out", heldOut(run)],
    ["Prelabels", run.prelabels && run.prelabels.said], ["GPU use", run.gpu_use || (run.predates || {}).gpu_use],
    ["Made with", madeWith(run.reproducibility) || (run.predates || {}).made_with], ["Error", run.error]];
  facts.replaceChildren(...rows.filter(([, v]) => v).flatMap(([k, v]) => [el("dt", {text: k}), el("dd", {text: String(v)})]));
  // A retry and the run it resumes link to each other.
  for (const [k, id] of [["Resumes run", run.resume_of], ["Retried as run", run.retried_by], ["Runs again run", run.rerun_of]]) {
    if (id) facts.append(el("dt", {text: k}), el("dd", {}, el("a", {href: "/admin/training/runs/" + id, text: id})));
  }
  finished = ["succeeded", "failed", "cancelled", "broken"].includes(run.state);
  const step = document.getElementById("step");
  step.replaceChildren(el("span", {text: finished ? "" : run.step || ""}));
  const bar = progressBar(run.progress);
  if (bar && !finished) step.append(bar);
  document.getElementById("cancel").hidden = finished;
  document.getElementById("retry").hidden = !["failed", "cancelled"].includes(run.state) || Boolean(run.retried_by);
  document.getElementById("rerun").hidden = !finished || run.state === "broken";
  showRater(run);
  return run;
}

// The reproducibility record in one line (the whole of it: GET runs/{id}'s `reproducibility`).
function madeWith(r) {
  if (!r) return "";
  const packages = Object.entries(r.packages || {}).map(([k, v]) => k + " " + v).join(", ");
  const gpus = (r.gpus || []).length ? r.gpus.join(", ") + (r.driver ? " (driver " + r.driver + ", CUDA " + r.cuda + ")" : "") : "no GPU";
  return `potato-queue ${r.potato_queue} (code ${String(r.code_sha256).slice(0, 12)}) on ${r.host}, Python ${r.python}; `
    + `${packages}; ${gpus}; bundle ${String(r.bundle_digest).slice(0, 12)}; seeds ${JSON.stringify(r.seeds)}`;
}

async function tailLog() {
  const text = await api("/runs/" + RUN + "/log?offset=" + logOffset);
  if (text) {
    logOffset += new TextEncoder().encode(text).length;
    const log = document.getElementById("log");
    log.textContent += text;
    log.scrollTop = log.scrollHeight;
  }
}

async function readEvents() {
  const events = await api("/runs/" + RUN + "/events?after=" + eventsSeen);
  eventsSeen += events.length;
  // A learning curve's points have their own chart (insight.js), not steps of this one.
  const fresh = events.filter((e) => e.event === "metric" && typeof e.value === "number" && e.split !== "curve");
  if (fresh.length) { metrics.push(...fresh); drawChart(); }
}

function drawChart() {
  const box = document.getElementById("chart"), width = 640, height = 240, pad = 36;
  const series = {};
  metrics.forEach((m, i) => { (series[m.split + "/" + m.name] = series[m.split + "/" + m.name] || []).push([m.step ?? i, m.value]); });
  const xs = metrics.map((m, i) => m.step ?? i), ys = metrics.map((m) => m.value);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs, Math.min(...xs) + 1)];
  const [y0, y1] = [Math.min(0, ...ys), Math.max(1, ...ys)];
  const x = (v) => pad + (v - x0) / (x1 - x0) * (width - 2 * pad), y = (v) => height - pad - (v - y0) / (y1 - y0) * (height - 2 * pad);
  const chart = svg("svg", {viewBox: `0 0 ${width} ${height}`, width: "100%", class: "chart"});
  chart.append(svg("line", {x1: pad, y1: height - pad, x2: width - pad, y2: height - pad, class: "axis"}));
  chart.append(svg("line", {x1: pad, y1: pad, x2: pad, y2: height - pad, class: "axis"}));
  const label = (text, lx, ly) => { const t = svg("text", {x: lx, y: ly, class: "tick"}); t.textContent = text; chart.append(t); };
  label(y1.toFixed(2), 2, pad + 4); label(y0.toFixed(2), 2, height - pad); label("step " + x0, pad, height - 8); label("step " + x1, width - pad - 50, height - 8);
  const legend = el("ul", {class: "legend"});
  Object.entries(series).forEach(([name, points], k) => {
    const cls = "series s" + (k % 6);
    chart.append(svg("polyline", {points: points.map(([a, b]) => x(a) + "," + y(b)).join(" "), class: cls}));
    for (const [a, b] of points) {
      const dot = svg("circle", {cx: x(a), cy: y(b), r: 3, class: cls + " point", "data-series": name});
      const tip = svg("title", {}); tip.textContent = `${name} at step ${a}: ${b}`; dot.append(tip);
      chart.append(dot);
    }
    legend.append(el("li", {class: cls, text: name}));
  });
  box.replaceChildren(chart, legend);
}

// The server's summary (counts, a sample), not the file: at 100,000 items the file is 15 MB. The file itself is
// the download link. A line that is not a prediction (not JSON, cut short; the server's rule in
// runs/finalize.py: an object with instance_id and schema_name) is counted and skipped, so that one bad line
// cannot hide the others.
async function predictions() {
  const box = document.getElementById("predictions");
  let found;
  try { found = await api("/runs/" + RUN + "/predictions/summary"); } catch (err) { box.textContent = "none yet"; return; }
  const table = el("table", {}, el("thead", {}, el("tr", {}, el("th", {text: "Schema: label"}), el("th", {text: "Items"}))));
  table.append(el("tbody", {}, ...Object.entries(found.counts).map(([k, n]) => el("tr", {}, el("td", {text: k}), el("td", {text: String(n)})))));
  const sample = el("table", {class: "sample"}, el("thead", {}, el("tr", {}, el("th", {text: "Item"}), el("th", {text: "Schema"}), el("th", {text: "Label"}), el("th", {text: "Confidence"}))));
  sample.append(el("tbody", {}, ...found.sample.map((p) => el("tr", {}, el("td", {text: String(p.instance_id)}), el("td", {text: p.schema_name}),
    el("td", {text: labelOf(p)}), el("td", {text: typeof p.confidence === "number" ? p.confidence.toFixed(3) : "-"})))));
  const broken = found.not_predictions, one = broken === 1;
  const said = broken ? [el("p", {class: "problem", role: "status", text: `${broken} ${one ? "line" : "lines"} of predictions.jsonl ` +
    `${one ? "is" : "are"} not a JSON prediction and not shown (download the file to see ${one ? "it" : "them"})`})] : [];
  box.replaceChildren(el("p", {text: found.total + " predictions "}, el("a", {href: API + "/runs/" + RUN + "/predictions.jsonl", download: "", text: "download predictions.jsonl"})),
    ...said, table, el("h3", {text: "A sample"}), sample);
}

// A multiselect's payload is a list of {label, confidence}; a slider's the bare number.
function labelOf(p) {
  if (Array.isArray(p.payload)) return p.payload.map((x) => x.label).join(", ") || "(no label)";
  return p.payload && typeof p.payload === "object" ? p.payload.label : p.payload;
}

document.getElementById("cancel").addEventListener("click", async () => {
  if (!window.confirm("Cancel run " + RUN + "?")) return;
  await api("/runs/" + RUN + "/cancel", {method: "POST"});
});

document.getElementById("rerun").addEventListener("click", async () => {
  if (!window.confirm("Run " + RUN + " again on the same data, params and seed, and compare the two?")) return;
  const problem = document.getElementById("retry-problem");
  problem.textContent = "";
  try {
    const again = await api("/runs/" + RUN + "/rerun", {method: "POST", body: "{}"});
    window.location.href = "/admin/training/runs/" + again.run_id;
  } catch (err) { problem.textContent = err.message; }
});

document.getElementById("retry").addEventListener("click", async () => {
  if (!window.confirm("Retry run " + RUN + " as a new run that resumes from its last checkpoint, on the same data?")) return;
  const problem = document.getElementById("retry-problem");
  problem.textContent = "";
  try {
    const retry = await api("/runs/" + RUN + "/retry", {method: "POST"});
    window.location.href = "/admin/training/runs/" + retry.run_id;
  } catch (err) { problem.textContent = err.message; }
});

async function tick() {
  try {
    await refresh();
    await Promise.all([tailLog(), readEvents()]);
    if (finished && !document.querySelector("#predictions table")) await predictions();
  } catch (err) { document.getElementById("step").textContent = "reconnecting: " + err.message; }
  setTimeout(tick, finished ? 5000 : 1000);
}
tick();
