"""retain_runs: the bulky files of old runs are removed once a run ends.

A run's bundle (a copy of the project's annotations) and its model files are
the large part of its folder. Of the finished runs, the newest
`model_training.retain_runs` keep everything; older ones lose their bundle,
their model files and the local agent's copies, and keep their record,
logs, events and predictions. Never touched: a run not yet finished, and
the latest successful run (whose model and predictions the project uses,
and decision-calibrate recalibrates), however old.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from potato_queue.store import FINAL_STATES, RunStore, utc_now

__all__ = ["prune_old_runs"]


def _bulky(store: RunStore, run_id: str) -> list[Path]:
    paths = store.paths(run_id)
    return [p for p in (paths.bundle, paths.bundle_dir, paths.artifacts, paths.agent_workdir) if p.exists()]


def prune_old_runs(store: RunStore, retain: int) -> list[str]:
    """Remove the bundles and model files of finished runs beyond the newest `retain`; the ids pruned."""
    finished = []
    for run_id in store.run_ids():
        try:
            finished.append((run_id, store.read(run_id)))
        except KeyError:
            continue  # unreadable: not ours to judge
    finished = [(i, r) for i, r in finished if r.get("state") in FINAL_STATES]
    succeeded = [i for i, r in finished if r.get("state") == "succeeded"]
    keep = {i for i, _ in finished[len(finished) - retain:]} if retain else set()
    keep |= set(succeeded[-1:])
    pruned = []
    for run_id, record in finished:
        bulky = _bulky(store, run_id)
        if run_id in keep or not bulky:
            continue
        for path in bulky:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        store.update(run_id, record, pruned_at=utc_now())
        store.log(run_id, f"bundle and model files removed: model_training.retain_runs keeps the newest {retain} runs")
        pruned.append(run_id)
    return pruned
