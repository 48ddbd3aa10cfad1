"""A re-run: an ended run started again on the same bundle, trainer, schemes, params and seed, to see whether
it reproduces (on its backend or another).

Unlike a retry (runs/retry.py) it resumes nothing: it trains from the beginning, on a copy of the original's
bundle (runs/job.py), with the original's seed. When it ends, the comparison (insight/compare.py, with the two
reproducibility records' differences) says what changed: the scores, McNemar's test, the predictions, and
which of code, packages, GPU, host or seeds differed.
"""

from __future__ import annotations

from collections.abc import Callable

from potato_queue.config import ProjectConfig
from potato_queue.errors import Conflict
from potato_queue.run import FINAL_STATES, RunRecord
from potato_queue.runs.kept_bundles import kept_bundle
from potato_queue.runs.retry import bundle_gone
from potato_queue.runs.submit import start_again
from potato_queue.store import RunStore

__all__ = ["rerun_run"]


def _refusal(config: ProjectConfig, store: RunStore, old: RunRecord) -> Conflict | None:
    run_id, state = old["run_id"], old["state"]
    if state not in FINAL_STATES:
        return Conflict(f"Run {run_id} is {state}: only a run that ended can be run again", fix="wait for it to end")
    if old.get("job") is None:
        return Conflict(
            f"Run {run_id} ended before its bundle was built: there is nothing to run again",
            fix="start a new run instead: it trains on the annotations as they are now",
        )
    if kept_bundle(store, old) is None:  # its own, or a kept run's with the same digest
        return bundle_gone(config, run_id, rerun=True)
    return None


def rerun_run(
    config: ProjectConfig, store: RunStore, enqueue: Callable[[str], None], old: RunRecord, backend: str | None = None
) -> RunRecord:
    """Queue `old` again (on `backend`, by default its own): Conflict saying why not."""
    refused = _refusal(config, store, old)
    if refused is not None:
        raise refused
    record = start_again(config, store, enqueue, old, backend=backend, trigger="rerun", rerun_of=old["run_id"])
    # The original names its re-runs: retention keeps a run a kept re-run compares with.
    store.update(old["run_id"], rerun_by=[*(store.read(old["run_id"]).get("rerun_by") or []), record["run_id"]])
    store.log(old["run_id"], f"run again as run {record['run_id']} on {record['backend']}, to compare")
    return record
