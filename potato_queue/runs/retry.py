"""A retry: a failed or cancelled run started again as a new run that resumes from its checkpoints.

The retry trains on the same data (the old run's bundle, copied into the new
run's folder when the executor prepares it, runs/job.py) with the same trainer,
schemas, params and backend. Its job's `resume_of` names the run whose
checkpoint folder on the training machine it uses (agent/checkpoints.py): the
first run of a chain of retries, since each retry saves into that same folder.
A run is retried once (one claim in Redis, however many ask at once); a retry that fails too is
retried in its turn.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import Any

from potato_queue.config import ProjectConfig
from potato_queue.errors import Conflict
from potato_queue.run import RunRecord, RunState
from potato_queue.runs.kept_bundles import kept_bundle
from potato_queue.runs.submit import start_again
from potato_queue.store import RunStore
from potato_queue.store.keys import RunPaths, new_run_id

__all__ = ["retry_run", "reuse_bundle", "copy_bundle", "checkpoint_owner", "bundle_gone", "RETRIED_STATES"]

RETRIED_STATES = (RunState.FAILED, RunState.CANCELLED)
_NEW_RUN_FIX = "start a new run instead: it trains on the annotations as they are now, from the beginning"


def bundle_gone(config: ProjectConfig, run_id: str, rerun: bool = False) -> Conflict:
    """The refusal of a retry (or, `rerun`, a re-run) whose run's bundle retain_runs removed."""
    keep = config.model_training.retain_runs
    if rerun:
        return Conflict(
            f"Run {run_id} cannot be run again: its bundle was removed (model_training.retain_runs keeps the "
            f"bundles of the newest {keep} succeeded runs and the newest {keep} others), so a re-run could not "
            "train on the same data",
            fix=f"{_NEW_RUN_FIX}; raise model_training.retain_runs to keep more runs' bundles",
        )
    return Conflict(
        f"Run {run_id} cannot be retried: its bundle was removed (model_training.retain_runs keeps "
        f"the bundles of the newest {keep} failed or cancelled runs), so the retry could not train on the same data",
        fix=f"{_NEW_RUN_FIX}; raise model_training.retain_runs to keep more runs' bundles",
    )


def _retried_already(run_id: str, retry_id: str) -> Conflict:
    return Conflict(
        f"Run {run_id} was retried already, as run {retry_id}", fix=f"retry run {retry_id} if it did not succeed either"
    )


def _refusal(config: ProjectConfig, store: RunStore, old: RunRecord) -> Conflict | None:
    run_id, state = old["run_id"], old["state"]
    if state not in RETRIED_STATES:
        fix = _NEW_RUN_FIX if state == RunState.SUCCEEDED else "wait for it to end (or cancel it), then retry it"
        return Conflict(f"Run {run_id} is {state}: only a failed or cancelled run can be retried", fix=fix)
    if old.get("retried_by"):
        return _retried_already(run_id, old["retried_by"])
    if old.get("job") is None:
        return Conflict(f"Run {run_id} ended before its bundle was built: there is nothing to resume", fix=_NEW_RUN_FIX)
    if not (store.paths(run_id).bundle_dir / "manifest.json").is_file():
        return bundle_gone(config, run_id)
    return None


def retry_run(config: ProjectConfig, store: RunStore, enqueue: Callable[[str], None], old: RunRecord) -> RunRecord:
    """Queue the retry of `old` (Conflict saying why not); the old run's record names it (`retried_by`)."""
    refused = _refusal(config, store, old)
    if refused is not None:
        raise refused
    # run.json's retried_by is the lasting word, but two retries asked at once both read it unset: the claim
    # in Redis decides which of them is the retry before either writes anything.
    retry_id = new_run_id()
    winner = store.in_flight.claim_retry(old["run_id"], retry_id)
    if winner is not None:
        raise _retried_already(old["run_id"], winner)
    try:
        record = start_again(config, store, enqueue, old, trigger="retry", resume_of=old["run_id"], run_id=retry_id)
    except BaseException:
        # Written but not queued (or not recorded in Potato): the run exists and an executor may take it, so it
        # stays the retry; only a retry that was never written gives its claim back.
        if not store.paths(retry_id).run_json.exists():
            store.in_flight.release_retry(old["run_id"], retry_id)
        raise
    store.update(old["run_id"], retried_by=record["run_id"])
    store.log(old["run_id"], f"retried as run {record['run_id']}, which resumes from this run's checkpoints")
    return record


def reuse_bundle(config: ProjectConfig, store: RunStore, record: RunRecord, paths: RunPaths) -> dict[str, Any]:
    """The bundle of the run a retry resumes (or a re-run repeats), copied into the new run's folder: its
    manifest. A bundle removed since the run was queued (retain_runs) fails it with the refusal's words."""
    earlier = str(record.get("resume_of") or record.get("rerun_of"))
    try:
        # The earlier run's own bundle, or, pruned since, a kept run's with the same digest.
        source = kept_bundle(store, store.read(earlier)) or store.paths(earlier)
        return copy_bundle(source, paths)
    except (FileNotFoundError, KeyError):
        raise bundle_gone(config, earlier, rerun="rerun_of" in record) from None


def copy_bundle(source: RunPaths, dest: RunPaths) -> dict[str, Any]:
    """Another run's bundle folder and tar.gz copied into this run's (media links stay links, as built): the
    manifest. OSError when a file is gone."""
    shutil.rmtree(dest.bundle_dir, ignore_errors=True)
    shutil.copytree(source.bundle_dir, dest.bundle_dir, symlinks=True)
    shutil.copyfile(source.bundle, dest.bundle)
    manifest: dict[str, Any] = json.loads((dest.bundle_dir / "manifest.json").read_text(encoding="utf-8"))
    return manifest


def checkpoint_owner(store: RunStore, record: RunRecord) -> str | None:
    """The run whose checkpoint folder a retry resumes from: the first of its chain of retries (None: not a
    retry). Each retry saves into that same folder, so a retry of a retry finds the newest checkpoint there."""
    retried = record.get("resume_of")
    if retried is None:
        return None
    try:
        earlier = (store.read(retried).get("job") or {}).get("resume_of")
    except KeyError:
        earlier = None
    return str(earlier or retried)
