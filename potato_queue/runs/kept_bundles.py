"""Where a run's bundle can still be read once retain_runs removed its own copy.

Runs on unchanged annotations share one bundle (a later run copies the earlier one's, runs/job.py), and a
re-run trains on a copy of its original's (runs/rerun.py): the bundle's digest names its content. So a pruned
run's held-out labels are still on disk wherever a kept run holds a bundle of the same digest, and the rater,
a re-run and a comparison read that one. With no copy left they refuse before they change anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from potato_queue.errors import Conflict
from potato_queue.store import RunStore
from potato_queue.store.keys import RunPaths

__all__ = ["kept_bundle", "bundle_digest", "no_copy_left"]


def bundle_digest(record: Mapping[str, Any]) -> str | None:
    """The digest of the bundle the run trained on (None: it ended before its bundle was built)."""
    return (record.get("bundle") or {}).get("digest") or None


def _digest_of(paths: RunPaths) -> str | None:
    """The digest of the bundle a run folder holds, None where it holds none (or half of one)."""
    manifest = paths.bundle_dir / "manifest.json"
    if not (manifest.is_file() and paths.bundle.is_file()):
        return None
    try:
        return str(json.loads(manifest.read_text(encoding="utf-8")).get("digest") or "") or None
    except (OSError, ValueError):
        return None


def kept_bundle(store: RunStore, record: Mapping[str, Any]) -> RunPaths | None:
    """The folder of a run that holds this run's bundle: its own while it has it, else the newest kept run's
    with the same digest; None when no copy is left."""
    own = store.paths(str(record["run_id"]))
    digest = bundle_digest(record)
    found = _digest_of(own)
    if found is not None and (digest is None or found == digest):
        return own
    if digest is None:
        return None
    for run_id in reversed(store.index.bulky_runs()):  # the runs whose folders still hold a bundle, newest first
        paths = store.paths(run_id)
        if run_id != record["run_id"] and _digest_of(paths) == digest:
            return paths
    return None


def no_copy_left(store: RunStore, record: Mapping[str, Any], what: str) -> Conflict:
    """The refusal of `what` (e.g. `so no rater is written`) for a run whose bundle has no copy left."""
    keep = store.config.model_training.retain_runs
    digest = bundle_digest(record)
    return Conflict(
        f"Run {record['run_id']}'s bundle was removed (model_training.retain_runs keeps the bundles of the newest "
        f"{keep} succeeded runs), and no kept run holds a copy of it{f' (digest {digest[:12]})' if digest else ''}: "
        f"its held-out labels are gone, {what}",
        fix="pick a newer run, or raise model_training.retain_runs to keep more runs' bundles",
    )
