"""Finalize a run's predictions: held-out scores and write-back.

Scoring uses the predictions the run sent back and the targets in the run's
own bundle, so it is the same whatever backend trained the model. Write-back
stores every valid prediction in Potato's store (potato_ledger) and writes the
project's predictions.jsonl with what passes Potato's rules (runs/gate.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from potato_queue.bounds import clean, too_deep
from potato_queue.config import ProjectConfig
from potato_queue.runs.gate import (
    HELD_OUT_SPLITS,
    PublishRules,
    Refusal,
    bundle_split_ids,
    label_of,
    potato_cannot_show,
    publishable,
    refusals,
    schema_kinds,
)
from potato_queue.store import RunStore
from potato_queue.store.keys import project_predictions_path
from potato_queue.wire.files import read_jsonl, write_atomic
from potato_queue.wire.scales_file import read_scales
from potato_queue.wire.scoring import score

__all__ = ["finalize_predictions", "read_predictions", "published_predictions"]

# A line of the project's predictions.jsonl: Potato's prediction line and the run it came from.
PUBLISHED_KEYS = ("instance_id", "schema_name", "payload", "confidence", "run_id")


def read_predictions(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The prediction objects of a run's predictions.jsonl (made servable), and the numbers of the
    lines that are not one (not JSON, not an object, no instance_id or schema_name)."""
    good: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, row in read_jsonl(path, not_json="none", missing_ok=True, errors="replace"):
        if (
            isinstance(row, dict)
            and isinstance(row.get("instance_id"), (str, int))
            and isinstance(row.get("schema_name"), str)
            and too_deep(row, "a prediction") is None
        ):
            good.append(clean(row))
        else:
            bad.append(number)
    return good, bad


def _split_ids(bundle_dir: Path, split: str) -> dict[str, dict[str, Any]]:
    return {
        str(row["instance_id"]): row.get("targets") or {}
        for _, row in read_jsonl(bundle_dir / f"{split}.jsonl", not_json="skip", missing_ok=True)
    }


def _held_out(bundle_dir: Path, schemas: Iterable[str], preds: list[dict[str, Any]]) -> dict[str, Any]:
    by_schema: dict[str, dict[str, Any]] = {}
    for p in preds:
        by_schema.setdefault(str(p.get("schema_name")), {})[str(p.get("instance_id"))] = label_of(p)
    kinds = schema_kinds(bundle_dir)
    rows = {split: _split_ids(bundle_dir, split) for split in HELD_OUT_SPLITS}  # each split read once
    scales = read_scales(str(bundle_dir))  # a labelled likert is scored by its points' order
    result: dict[str, Any] = {}
    for schema in schemas:
        result[schema] = {}
        for split in HELD_OUT_SPLITS:
            targets = {i: t[schema] for i, t in rows[split].items() if schema in t}
            result[schema][split] = score(
                targets, by_schema.get(schema, {}), kinds.get(schema, "nominal"), scales.get(schema, {}).get("points")
            )
    return result


def _train_ids_on_disk(store: RunStore, run_id: str) -> set[str]:
    """Without Potato's store, the leak guard's items: the train split of every run whose bundle is on disk
    (retain_runs removes old bundles; Potato's store keeps every run's)."""
    out: set[str] = set()
    for other in {*store.run_ids(), run_id}:
        out.update(bundle_split_ids(store.paths(other).bundle_dir)["train"])
    return out


def _candidates(
    config: ProjectConfig, store: RunStore, run_id: str, valid: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Every stored prediction, latest per item and schema, this run's laid over them: Potato's table when
    write-back is on (what Potato publishes at its start), else the published file."""
    stored = store.potato.stored_predictions()
    merged = {
        (str(p["instance_id"]), p["schema_name"]): p
        for p in (stored if stored is not None else published_predictions(config))
    }
    for p in valid:  # a run Potato records itself is not in its table yet
        merged[(str(p["instance_id"]), p["schema_name"])] = {**p, "run_id": run_id}
    return list(merged.values())


def _rules(config: ProjectConfig, store: RunStore, run_id: str) -> PublishRules:
    wb = config.model_training.writeback
    guard = store.potato.leak_guard()
    unshown = {str(s.get("name")): why for s in config.annotation_schemes if (why := potato_cannot_show(s))}
    return PublishRules(
        train_ids=guard if guard is not None else _train_ids_on_disk(store, run_id),
        schemas=set(wb.schemas),
        rejected=store.potato.rejected(),
        min_confidence=wb.min_confidence,
        unshown=unshown,
    )


def published_predictions(config: ProjectConfig) -> list[dict[str, Any]]:
    return read_predictions(project_predictions_path(config))[0]


def _publish(
    config: ProjectConfig, store: RunStore, run_id: str, valid: list[dict[str, Any]], refused: int
) -> dict[str, Any]:
    """Write the project's predictions.jsonl (what passes Potato's rules); what the run's record keeps of it."""
    rules = _rules(config, store, run_id)
    published = publishable(rules, _candidates(config, store, run_id, valid))
    lines = (json.dumps({k: p.get(k) for k in PUBLISHED_KEYS}, ensure_ascii=False) + "\n" for p in published)
    write_atomic(project_predictions_path(config), lines)
    ours = sum(1 for p in published if p.get("run_id") == run_id)
    kept = ", ".join(f"{n} {why}" for why, n in rules.skipped.items() if n)
    unshown = sorted({str(p["schema_name"]) for p in valid} & set(rules.unshown) & rules.schemas)
    said = (
        f"published {ours} of this run's {len(valid)} predictions as prelabels "
        f"({len(published)} in the project's predictions.jsonl{'; kept off: ' + kept if kept else ''})"
        + (f"; {refused} refused" if refused else "")
        + "".join(f"; {name}'s predictions are stored, not published: {rules.unshown[name]}" for name in unshown)
    )
    return {
        "published": ours,
        "predictions": len(valid),
        "refused": refused,
        "kept_off": dict(rules.skipped),
        "said": said,
        **({"not_shown": {name: rules.unshown[name] for name in unshown}} if unshown else {}),
    }


def _say_refused(store: RunStore, run_id: str, refused: list[Refusal]) -> None:
    if refused:
        named = "; ".join(r.said() for r in refused[:10]) + (" ..." if len(refused) > 10 else "")
        store.log(run_id, f"warning: refused {len(refused)} prediction(s), never stored or published: {named}")


def finalize_predictions(
    config: ProjectConfig, store: RunStore, record: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Score the held-out items, store every valid prediction in Potato's store, publish what passes
    Potato's rules; returns (held_out, what was published: the record's `prelabels`)."""
    run_id = record["run_id"]
    paths = store.paths(run_id)
    preds, bad = read_predictions(paths.predictions)
    if bad:
        lines = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
        store.log(
            run_id,
            f"warning: predictions.jsonl has {len(bad)} line(s) that are not a prediction "
            f"(a JSON object with instance_id and schema_name), skipped: line(s) {lines}",
        )
    valid, refused = refusals(config, paths.bundle_dir, preds, record["schemas"])
    _say_refused(store, run_id, refused)
    if not valid:
        store.log(run_id, "no predictions came back, so there is nothing to score or publish")
        return {}, None
    held_out = _held_out(paths.bundle_dir, record["schemas"], valid)
    store.potato.record_predictions(record, valid)
    pruned = store.potato.prune(record, config.model_training.retain_runs)
    if pruned:
        store.log(
            run_id,
            f"Potato's store: {len(pruned)} older run(s) pruned with their run items "
            f"({', '.join(pruned)}): Potato keeps the newest {config.model_training.retain_runs} "
            f"(model_training.retain_runs) and every run whose predictions are still live",
        )
    prelabels = _publish(config, store, run_id, valid, len(refused))
    store.log(run_id, f"held-out scores: {json.dumps(held_out)}; {prelabels['said']}")
    return held_out, prelabels
