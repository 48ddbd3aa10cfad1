// Shared by the Training page and a run's page: the admin API with the session cookie and CSRF token.
"use strict";
const API = "/admin/training/api";
const CSRF = document.querySelector('meta[name="csrf"]').content;

async function api(path, options = {}) {
  const headers = Object.assign({"Content-Type": "application/json"}, options.headers || {});
  if (options.method && options.method !== "GET") headers["X-CSRF-Token"] = CSRF;
  const reply = await fetch(API + path, Object.assign({}, options, {headers, credentials: "same-origin"}));
  if (reply.status === 401) { window.location.href = "/admin/training"; throw new Error("signed out"); }
  const type = reply.headers.get("content-type") || "";
  const body = type.startsWith("application/json") ? await reply.json() : await reply.text();
  if (!reply.ok) throw new Error((body && body.detail) || reply.statusText);
  return body;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "text") node.textContent = value; else if (value !== null && value !== undefined) node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function duration(run) {
  const start = run.started_at && Date.parse(run.started_at);
  if (!start) return "";
  const end = run.finished_at ? Date.parse(run.finished_at) : Date.now();
  const s = Math.max(0, Math.round((end - start) / 1000));
  return s < 60 ? s + " s" : Math.floor(s / 60) + " min " + (s % 60) + " s";
}

function progressBar(progress) {
  if (!progress || !progress.total) return null;
  const bar = el("progress", {max: String(progress.total), value: String(progress.current || 0)});
  bar.setAttribute("aria-label", (progress.phase || "progress") + " " + progress.current + " of " + progress.total);
  return bar;
}

// Each kind's own measures: accuracy / macro-F1 (a classifier's, a likert's), micro-F1 (a multiselect's),
// MAE and QWK (a likert's), MAE and Spearman (a slider's, which has no accuracy).
const SCALE_MEASURES = [["micro_f1", "micro-F1"], ["mae", "MAE"], ["qwk", "QWK"], ["spearman", "Spearman"]];

function heldOut(run) {
  const parts = [];
  for (const [schema, splits] of Object.entries(run.held_out || {})) {
    const s = splits.test || splits.val;
    if (!s) continue;
    const shown = typeof s.accuracy === "number" ? [Number(s.accuracy).toFixed(3) + " / " + Number(s.macro_f1).toFixed(3)] : [];
    for (const [key, name] of SCALE_MEASURES) {
      if (typeof s[key] === "number" && (key !== "spearman" || typeof s.accuracy !== "number")) shown.push(name + " " + s[key].toFixed(3));
    }
    parts.push(schema + ": " + shown.join(", "));
  }
  return parts.join("; ");
}
