// The Training page: Runs on (with Check), the start form, the live Runs table.
"use strict";
let trainers = {};

async function loadForm() {
  const [backends, table, schemas] = await Promise.all([api("/backends"), api("/trainers"), api("/schemas")]);
  const menu = document.getElementById("backend");
  for (const b of backends) menu.append(el("option", {value: b.name, text: b.label, selected: b.default ? "" : null}));
  trainers = table;
  const select = document.getElementById("trainer");
  for (const name of Object.keys(table).sort()) select.append(el("option", {value: name, text: name}));
  select.value = table["sklearn-text"] ? "sklearn-text" : select.options[0].value;
  const box = document.getElementById("schemas");
  for (const s of schemas) {
    const id = "schema-" + s.name;
    box.append(el("label", {for: id, "data-kind": s.kind, "data-type": s.annotation_type || "", "data-modality": s.modality || "text",
                            "data-refused": s.refused || ""},
                  el("input", {type: "checkbox", id, name: "schema", value: s.name, checked: ""}), " " + s.name,
                  el("small", {class: "schema-why"})));
  }
  select.addEventListener("change", showTrainer);
  showTrainer();
  agents(backends);
}

// A trainer runs only on the kinds it declares: the others' boxes are off, and say why (the server refuses them too).
function offerSchemes(name, info) {
  const kinds = info.kinds || [], modalities = info.modalities || ["text"];
  for (const label of document.querySelectorAll("#schemas label[data-kind]")) {
    const input = label.querySelector("input"), refused = label.dataset.refused;
    const kindOk = !refused && kinds.includes(label.dataset.kind);
    const takes = kindOk && modalities.includes(label.dataset.modality);
    if (input.disabled === takes) input.checked = takes;
    input.disabled = !takes;
    label.querySelector(".schema-why").textContent = takes ? "" : refused ?
      " (" + label.dataset.type + ", " + label.dataset.kind + ": no trainer trains it: " + refused + ")" : !kindOk ?
      " (" + label.dataset.kind + (label.dataset.type ? ", " + label.dataset.type : "") + ": " + name + " trains " +
      (kinds.join("/") || "no") + " schemes)" :
      " (" + label.dataset.modality + " items: " + name + " trains on " + modalities.join("/") + " items)";
  }
}

function showTrainer() {
  const name = document.getElementById("trainer").value;
  const info = trainers[name] || {};
  offerSchemes(name, info);
  const hint = document.getElementById("trainer-hint");
  const missing = info.missing_here || [];
  hint.textContent = (info.description || "") + (missing.length ? " Not installed on this server (" + missing.join(", ") +
    "): " + info.install_hint : "");
  const box = document.getElementById("params");
  box.replaceChildren(el("legend", {text: "Params"}));
  for (const [name, value] of Object.entries(info.params || {})) {
    const id = "param-" + name;
    box.append(el("label", {for: id, text: name}),
               el("input", {id, name, "data-param": name, value: value === null ? "" : JSON.stringify(value).replace(/^"|"$/g, "")}));
  }
}

function params() {
  const out = {};
  const defaults = (trainers[document.getElementById("trainer").value] || {}).params || {};
  for (const input of document.querySelectorAll("[data-param]")) {
    const name = input.dataset.param, text = input.value.trim(), fallback = defaults[name];
    if (text === "" || text === String(fallback)) continue;
    out[name] = typeof fallback === "number" ? Number(text) : (text === "true" ? true : text === "false" ? false : text);
  }
  return out;
}

async function startRun(event) {
  event.preventDefault();
  const problem = document.getElementById("start-problem");
  problem.textContent = "";
  const schemas = [...document.querySelectorAll('input[name="schema"]:checked')].map((x) => x.value);
  try {
    await api("/runs", {method: "POST", body: JSON.stringify({trainer: document.getElementById("trainer").value,
      schemas, backend: document.getElementById("backend").value,
      params: Object.assign(params(), document.getElementById("learning-curve").checked ? {learning_curve: true} : {})})});
  } catch (err) { problem.textContent = err.message; }
}

async function check() {
  const name = document.getElementById("backend").value, out = document.getElementById("check-report");
  out.hidden = false;
  out.textContent = "checking " + name + "...";
  try {
    const report = await api("/backends/" + encodeURIComponent(name) + "/check");
    out.textContent = (report.ok ? "ok" : "a run could not start now") + "\n" + report.lines.join("\n");
    out.className = report.ok ? "ok" : "problem";
  } catch (err) { out.textContent = err.message; }
}

function row(run) {
  const cancel = el("button", {type: "button", class: "quiet", text: "Cancel run"});
  cancel.addEventListener("click", async () => {
    if (!window.confirm("Cancel run " + run.run_id + "?")) return;
    try { await api("/runs/" + run.run_id + "/cancel", {method: "POST"}); } catch (err) { window.alert(err.message); }
  });
  const active = !["succeeded", "failed", "cancelled", "broken"].includes(run.state);
  const step = el("td", {class: "step"}, el("span", {text: active ? run.step || "" : run.error || ""}));
  const bar = active ? progressBar(run.progress) : null;
  if (bar) step.append(bar);
  return el("tr", {"data-run": run.run_id, "data-state": run.state},
    el("td", {}, el("a", {href: "/admin/training/runs/" + run.run_id, text: run.run_id})),
    el("td", {class: "trainer", text: run.trainer || ""}), el("td", {text: run.ran_on || ""}), el("td", {class: "state", text: run.state}), el("td", {text: run.trigger || ""}),
    el("td", {text: heldOut(run)}), el("td", {text: duration(run)}),
    el("td", {text: (run.started_at || run.created_at || "").replace("T", " ").slice(0, 19)}), step,
    el("td", {}, active ? cancel : ""));
}

function follow() {
  const live = document.getElementById("live");
  const source = new EventSource(API + "/stream");
  source.addEventListener("runs", (event) => {
    live.textContent = "live";
    const runs = JSON.parse(event.data);
    document.querySelector("#runs tbody").replaceChildren(...runs.map(row));
    // The runs older than the stream's are loaded on demand; the first time, start after the stream's oldest.
    if (!document.getElementById("older-runs").children.length) oldest = runs.length ? runs[runs.length - 1].run_id : null;
    filterRows();
    countRuns(runs).catch(() => {});
    autoRetrain().catch(() => {});
  });
  source.addEventListener("error", () => { live.textContent = "reconnecting"; });
}

// History: the live table has the newest runs; "Older runs" loads the next page before the oldest shown, as often
// as asked (GET /runs?before=<run id>), and the line says how many there are.
let oldest = null, total = null, newestSeen = null;

async function runsPage(query) {
  const reply = await fetch(API + "/runs?" + query, {credentials: "same-origin"});
  if (!reply.ok) throw new Error(reply.statusText);
  return {runs: await reply.json(), total: Number(reply.headers.get("X-Total-Count")), next: reply.headers.get("X-Next-Before")};
}

async function countRuns(runs) {
  const newest = runs.length ? runs[0].run_id : null;
  if (newest === newestSeen && total !== null) return showHistory();
  newestSeen = newest;
  total = (await runsPage("limit=1")).total;
  showHistory();
}

function showHistory() {
  const shown = document.querySelectorAll("#runs tr[data-run]").length;
  document.getElementById("history").textContent = "Showing the newest " + shown + " of " + total + " runs";
  document.getElementById("older").hidden = !oldest || shown >= total;
}

async function older() {
  const page = await runsPage("limit=50&before=" + encodeURIComponent(oldest));
  document.getElementById("older-runs").append(...page.runs.map(row));
  oldest = page.next ? page.runs[page.runs.length - 1].run_id : null;
  total = page.total;
  filterRows();
  showHistory();
}

// Filters by state, trainer and where it ran, over every run loaded (the live ones and the older pages).
const FILTERS = {state: (r) => r.dataset.state, trainer: (r) => r.querySelector(".trainer").textContent,
                 backend: (r) => r.children[2].textContent};

function filterRows() {
  const rows = [...document.querySelectorAll("#runs tr[data-run]")];
  for (const [name, value] of Object.entries(FILTERS)) {
    const menu = document.getElementById("filter-" + name);
    const known = new Set([...menu.options].map((o) => o.value));
    for (const v of new Set(rows.map(value))) if (v && !known.has(v)) menu.append(el("option", {value: v, text: v}));
  }
  for (const r of rows) {
    r.hidden = Object.entries(FILTERS).some(([name, value]) => {
      const wanted = document.getElementById("filter-" + name).value;
      return wanted && value(r) !== wanted;
    });
  }
}

let retrainAsked = 0;
async function autoRetrain() {
  // The last beat check's reason; asked at most every 5 s (the runs stream may tick faster).
  if (Date.now() - retrainAsked < 5000) return;
  retrainAsked = Date.now();
  const status = await api("/auto_retrain");
  const line = document.getElementById("auto-retrain");
  line.hidden = !status.enabled;
  line.textContent = "Auto-retrain: " + status.reason;
  // The month's GPU budget: what each cap has used and has left (model_training.budget).
  const budget = await api("/budget");
  const said = document.getElementById("budget");
  said.hidden = !budget.caps.length;
  said.textContent = "Budget: " + budget.caps.map((cap) => cap.said).join("; ");
}

function agents(backends) {
  const pull = backends.filter((b) => b.type === "agent");
  if (!pull.length) return;
  const box = document.querySelector("#agents div");
  document.getElementById("agents").hidden = false;
  for (const b of pull) {
    const item = el("pre", {text: b.name + ": checking..."});
    const drain = el("button", {type: "button", class: "drain", "data-backend": b.name, text: "Drain its agents"});
    const path = "/backends/" + encodeURIComponent(b.name);
    const show = (r) => {
      item.textContent = r.lines.join("\n");
      drain.textContent = r.drain_switched ? "Stop draining" : "Drain its agents";
      drain.dataset.on = r.drain_switched ? "1" : "";
    };
    // Draining: the backend's agents finish their run, claim no new one, and exit.
    drain.addEventListener("click", async () => {
      await api(path + "/drain", {method: drain.dataset.on ? "DELETE" : "POST"});
      show(await api(path + "/check"));
    });
    box.append(item, drain);
    api(path + "/check").then(show);
  }
}

document.getElementById("start").addEventListener("submit", startRun);
document.getElementById("check").addEventListener("click", check);
document.getElementById("older").addEventListener("click", () => older().catch((err) => window.alert(err.message)));
for (const name of Object.keys(FILTERS)) document.getElementById("filter-" + name).addEventListener("change", filterRows);
loadForm().catch((err) => { document.getElementById("start-problem").textContent = err.message; });
follow();
setInterval(() => autoRetrain().catch(() => {}), 15000);
