"""Finalize a run's predictions: held-out scores (TRN-3) and write-back (TRN-2).

Scoring uses the predictions the run sent back and the targets in the run's
own bundle, so it is the same whatever backend trained the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from potato_queue.bounds import clean, too_deep
from potato_queue.config import ProjectConfig
from potato_queue.keys import project_predictions_path
from potato_queue.store import RunStore
from potato_queue.worker.files import write_atomic
from potato_queue.worker.scoring import score

__all__ = ["finalize_predictions", "read_jsonl", "read_predictions", "published_predictions"]

HELD_OUT_SPLITS = ("val", "test")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue


def read_predictions(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The prediction objects of a run's predictions.jsonl (made servable), and the numbers of the
    lines that are not one (not JSON, not an object, no instance_id or schema_name)."""
    good: list[dict[str, Any]] = []
    bad: list[int] = []
    if not path.exists():
        return good, bad
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if isinstance(row, dict) and isinstance(row.get("instance_id"), (str, int)) \
                    and isinstance(row.get("schema_name"), str) and too_deep(row, "a prediction") is None:
                good.append(clean(row))
            else:
                bad.append(number)
    return good, bad


def _label(prediction: dict[str, Any]) -> Any:
    payload = prediction.get("payload")
    return payload.get("label") if isinstance(payload, dict) else payload


def _split_ids(bundle_dir: Path, split: str) -> dict[str, dict[str, Any]]:
    return {str(row["instance_id"]): row.get("targets") or {} for row in read_jsonl(bundle_dir / f"{split}.jsonl")}


def _held_out(bundle_dir: Path, schemas: Iterable[str], preds: list[dict[str, Any]]) -> dict[str, Any]:
    by_schema: dict[str, dict[str, Any]] = {}
    for p in preds:
        by_schema.setdefault(str(p.get("schema_name")), {})[str(p.get("instance_id"))] = _label(p)
    result: dict[str, Any] = {}
    for schema in schemas:
        result[schema] = {}
        for split in HELD_OUT_SPLITS:
            rows = _split_ids(bundle_dir, split)
            targets = {i: t[schema] for i, t in rows.items() if schema in t}
            result[schema][split] = score(targets, by_schema.get(schema, {}))
    return result


def _publishable(config: ProjectConfig, bundle_dir: Path, preds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Potato's gates: never a train item, only writeback.schemas, confidence >= min_confidence."""
    wb = config.model_training.writeback
    train = set(_split_ids(bundle_dir, "train"))
    unlabeled = set(_split_ids(bundle_dir, "unlabeled"))
    out = []
    for p in preds:
        item = str(p.get("instance_id"))
        confidence = p.get("confidence")
        if item in train or p.get("schema_name") not in wb.schemas:
            continue
        if item in unlabeled and not wb.include_unlabeled:
            continue
        if not isinstance(confidence, (int, float)) or confidence < wb.min_confidence:
            continue
        out.append(p)
    return out


def published_predictions(config: ProjectConfig) -> list[dict[str, Any]]:
    return read_predictions(project_predictions_path(config))[0]


def finalize_predictions(config: ProjectConfig, store: RunStore, run_id: str, schemas: Iterable[str]) -> dict[str, Any]:
    """Score the held-out items and publish what passes the gates; returns held_out."""
    paths = store.paths(run_id)
    preds, bad = read_predictions(paths.predictions)
    if bad:
        lines = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
        store.log(run_id, f"warning: predictions.jsonl has {len(bad)} line(s) that are not a prediction "
                          f"(a JSON object with instance_id and schema_name), skipped: line(s) {lines}")
    if not preds:
        store.log(run_id, "no predictions came back, so there is nothing to score or publish")
        return {}
    held_out = _held_out(paths.bundle_dir, schemas, preds)
    published = _publishable(config, paths.bundle_dir, preds)
    merged = {(p["instance_id"], p["schema_name"]): p for p in published_predictions(config)}
    for p in published:
        merged[(p["instance_id"], p["schema_name"])] = {**p, "run_id": run_id}
    lines = (json.dumps(row, ensure_ascii=False) + "\n" for row in merged.values())
    write_atomic(project_predictions_path(config), lines)
    store.log(run_id, f"held-out scores: {json.dumps(held_out)}; published {len(published)} of {len(preds)} predictions")
    return held_out
