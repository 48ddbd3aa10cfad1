"""retain_run_records_days: a finished run's whole folder goes once it is older than that (default a year).

retain_runs (runs/retention.py) removes a run's bundle and model files early; what stays (run.json, run.log,
events.jsonl, predictions.jsonl, insight.json: some tens of KB a run) would still grow with every run a
scheduled retrain makes. So a run created more than `model_training.retain_run_records_days` days ago loses its
folder, unless something still cites it:
- the latest succeeded run (the project's model, decision-calibrate's input);
- a run whose predictions the project's predictions.jsonl still publishes (Potato's prelabels);
- the run a machine rater in Potato holds the answers of;
- a run a kept run retried or re-ran (`retried_by`, `rerun_by`: the retry's and the re-run's page link to it).
A run not yet finished, and one whose run.json cannot be read (the admin's to look at), are never removed.
Its Redis keys go with it. Potato's own row of the run (its Training page) is Potato's, and stays.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from potato_queue.run import FINAL_STATES
from potato_queue.runs.finalize import published_predictions
from potato_queue.runs.rater import rater_runs
from potato_queue.store import RunStore

__all__ = ["prune_old_records"]

_log = logging.getLogger("potato_queue.runs")


def _cited(store: RunStore) -> set[str]:
    """The runs the project still points at: its latest success, its published predictions', its raters'."""
    cited = {str(p.get("run_id")) for p in published_predictions(store.config) if p.get("run_id")}
    cited |= rater_runs(store.config)
    latest = store.latest_succeeded()
    return cited | ({latest} if latest else set())


def _cited_by_a_kept_run(store: RunStore, record: Mapping[str, Any]) -> bool:
    later = [record.get("retried_by"), *(record.get("rerun_by") or [])]
    return any(run_id and store.paths(str(run_id)).run_json.exists() for run_id in later)


def prune_old_records(store: RunStore, days: int | None) -> list[str]:
    """Remove the folders of finished runs created over `days` days ago that nothing cites; the ids removed."""
    if days is None:
        return []
    cutoff = (datetime.fromtimestamp(store.clock.now_s(), timezone.utc) - timedelta(days=days)).strftime("%Y%m%d")
    old = []
    for run_id in store.run_ids():  # oldest first: a run id starts with its creation date
        if run_id[:8] >= cutoff:
            break
        old.append(run_id)
    if not old:
        return []
    cited, removed = _cited(store), []
    for run_id in old:
        try:
            record = store.read(run_id)
        except KeyError:
            continue
        if record.get("state") not in FINAL_STATES or run_id in cited or _cited_by_a_kept_run(store, record):
            continue
        shutil.rmtree(store.paths(run_id).dir, ignore_errors=True)
        store.forget(run_id)
        removed.append(run_id)
    if removed:
        _log.info("removed %d run folder(s) older than %d days (retain_run_records_days)", len(removed), days)
    return removed
