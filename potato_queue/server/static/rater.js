// A run's page: the model as one more rater. Its agreement with the annotators beside theirs with each other
// (on held-out items), and whether it is a machine rater in Potato, with the button that makes or removes it.
"use strict";

function withInterval(value, interval) {
  if (value === null || value === undefined) return "n/a";
  return interval ? `${value.toFixed(2)} (${interval[0].toFixed(2)} to ${interval[1].toFixed(2)})` : value.toFixed(2);
}

function agreementTable(figures) {
  const head = el("tr", {}, ...["", "Cohen's kappa", "Krippendorff's alpha", "Percent agreement"].map((t) => el("th", {text: t})));
  const rows = [["The annotators with each other", figures.human_human], ["The model with the annotators", figures.model_human]]
    .filter(([, f]) => f)
    .map(([name, f]) => el("tr", {}, el("th", {text: name}),
      ...["kappa", "alpha", "percent_agreement"].map((k) => el("td", {text: withInterval(f[k], f[k + "_interval"])}))));
  return el("table", {}, el("caption", {text: `${figures.items} held-out items that two annotators answered, `
    + `${figures.annotators} annotators (95% bootstrap intervals); never the run's train split`}), head, ...rows);
}

function raterLine(run) {
  const rater = run.machine_annotator;
  const line = el("p", {id: "rater-said"});
  const button = el("button", {type: "button", id: "rater"});
  if (rater && !rater.removed) {
    line.textContent = `A machine rater in Potato as ${rater.id} (${rater.items} held-out items): Potato's agreement `
      + "report and adjudication show it beside the annotators from Potato's next start.";
    button.textContent = "Remove it from Potato";
    button.dataset.method = "DELETE";
  } else {
    line.textContent = "Not a machine rater in Potato.";
    button.textContent = "Make it a machine rater in Potato";
    button.dataset.method = "POST";
  }
  button.addEventListener("click", async () => {
    const asked = button.dataset.method === "POST"
      ? `Make run ${RUN} a machine rater in Potato (its answers on the held-out items, replacing the older run's of this trainer)?`
      : `Remove run ${RUN} from Potato as a machine rater (every answer of it)?`;
    if (!window.confirm(asked)) return;
    const problem = document.getElementById("rater-problem");
    problem.textContent = "";
    try { await api("/runs/" + RUN + "/rater", {method: button.dataset.method}); await refresh(); }
    catch (err) { problem.textContent = err.message; }
  });
  return [line, button, el("span", {id: "rater-problem", class: "problem", role: "alert"})];
}

let raterShown = "";

function showRater(run) {
  const section = document.getElementById("agreement");
  if (run.state !== "succeeded") { section.hidden = true; return; }
  const key = JSON.stringify([run.agreement, run.machine_annotator]);
  if (key === raterShown) return;  // drawn already: a problem said stays said
  raterShown = key;
  const parts = [];
  for (const [schema, figures] of Object.entries(run.agreement || {})) {
    parts.push(el("h3", {text: schema}), el("p", {class: "said", text: figures.said}));
    if (figures.items) parts.push(agreementTable(figures));
  }
  if (!parts.length) parts.push(el("p", {text: (run.predates || {}).agreement ||
    "No agreement figures: the run's schemes are not compared as labels, or it predicted no held-out item."}));
  section.querySelector("div").replaceChildren(...parts, ...raterLine(run));
  section.hidden = false;
}
