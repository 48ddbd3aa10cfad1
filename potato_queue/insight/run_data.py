"""What the insight reads of a run: its predictions as they came back, and its own bundle's splits, gold
labels and texts. Nothing of the training machine: every backend's run is read the same way.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from potato_queue.errors import Conflict
from potato_queue.insight.measures import Scored
from potato_queue.run import RunState
from potato_queue.runs.finalize import HELD_OUT_SPLITS, read_predictions
from potato_queue.runs.gate import label_of, schema_kinds
from potato_queue.runs.kept_bundles import kept_bundle, no_copy_left
from potato_queue.store import RunStore
from potato_queue.wire.files import read_jsonl
from potato_queue.wire.scales_file import read_scales
from potato_queue.wire.scoring import MULTILABEL, SPAN, gold_label
from potato_queue.wire.span_scores import as_spans

__all__ = ["RunData", "load_run", "run_data", "refuse_unsucceeded", "shown", "as_scored", "scored", "potato_item_path"]


def shown(label: Any) -> str | None:
    """A label as the insight shows and compares it: its text, JSON for a list or object; None for none. A
    multiselect's set is sorted: the annotators' order and the model's are the same answer."""
    label = gold_label(label)
    if label is None:
        return None
    if isinstance(label, float) and label.is_integer():
        label = int(label)  # a likert's answer 4.0 and its predicted point 4 are the same answer
    if isinstance(label, list) and all(isinstance(x, str) for x in label):
        label = sorted(label)
    spans = _spans(label)
    if spans is not None:  # a span scheme's: [start, end, label] each, in order (a confidence, a title are not)
        label = [list(span) for span in spans]
    return label if isinstance(label, str) else json.dumps(label, sort_keys=True, ensure_ascii=False)


def _spans(label: Any) -> list[tuple[int, int, str]] | None:
    """A span or a list of spans ({start, end, label or name, ...}) as compared; None for anything else."""
    entries = [label] if isinstance(label, dict) else label
    if not isinstance(entries, list) or not entries or not all(isinstance(x, dict) and "start" in x for x in entries):
        return None
    return as_spans(entries)


def as_scored(label: str | None, kind: str) -> Any:
    """A label as shown, back in the form wire/scoring.py scores by *kind* (a multiselect's set a list, a
    span scheme's spans a list of them)."""
    if kind in (MULTILABEL, SPAN) and label is not None and label.startswith("["):
        found = json.loads(label)
        return [{"start": s, "end": e, "label": name} for s, e, name in found] if kind == SPAN else found
    return label


def potato_item_path(instance_id: str) -> str:
    """Potato 2.12's route for everything it holds on one item (JSON; Potato's admin key in X-API-Key): it
    has no page for a single item, so this is the item's link into Potato."""
    return "/admin/item_state/" + urllib.parse.quote(instance_id, safe="")


@dataclass
class RunData:
    record: Mapping[str, Any]
    predictions: dict[tuple[str, str], dict[str, Any]]  # (instance id, schema): the prediction
    split_of: dict[str, str] = field(default_factory=dict)  # instance id: val, test or unlabeled
    gold: dict[str, dict[str, str]] = field(default_factory=dict)  # schema: {held-out id: gold label}
    texts: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)  # schema: its kind, as the run's bundle recorded it
    scales: dict[str, dict[str, Any]] = field(default_factory=dict)  # schema: its scale (the bundle's scales.json)

    @property
    def run_id(self) -> str:
        return str(self.record["run_id"])

    @property
    def schemas(self) -> list[str]:
        return [str(s) for s in self.record.get("schemas") or []]


def refuse_unsucceeded(record: Mapping[str, Any]) -> None:
    """Conflict (with what to do) for a run that has not succeeded: only a succeeded one is looked into."""
    if record.get("state") != RunState.SUCCEEDED:
        raise Conflict(
            f"run {record['run_id']} is {record.get('state')}: only a succeeded run has predictions to look into",
            fix="wait for it to succeed, or pick a run that did",
        )


def load_run(store: RunStore, record: Mapping[str, Any]) -> RunData:
    """The run's predictions and bundle; Conflict (with what to do) when the run has none to read."""
    refuse_unsucceeded(record)
    return run_data(store, record)


def run_data(store: RunStore, record: Mapping[str, Any], good: list[dict[str, Any]] | None = None) -> RunData:
    """The run's predictions (`good`: read_predictions' already in hand) and bundle, whatever its state (its
    end reads them before it succeeds); Conflict when its files are gone."""
    run_id = record["run_id"]
    paths = store.paths(run_id)
    good = read_predictions(paths.predictions)[0] if good is None else good
    if not good:
        raise Conflict(
            f"run {run_id} has no predictions on this server ({paths.predictions} is missing or empty)",
            fix="pick a later run; a run's predictions come back when it succeeds",
        )
    source = kept_bundle(store, record)  # pruned: a kept run's copy of the same bundle
    if source is None:
        raise no_copy_left(store, record, "so it cannot be compared or scored again")
    bundle_dir = source.bundle_dir
    data = RunData(
        record,
        {(str(p["instance_id"]), str(p["schema_name"])): p for p in good},
        kinds=schema_kinds(bundle_dir),
        scales=read_scales(str(bundle_dir)),
    )
    for split in (*HELD_OUT_SPLITS, "unlabeled"):
        for _, row in read_jsonl(bundle_dir / f"{split}.jsonl", not_json="skip", missing_ok=True):
            if not isinstance(row, dict):
                continue
            iid = str(row.get("instance_id"))
            data.split_of[iid], data.texts[iid] = split, str(row.get("text") or "")
            for schema, target in (row.get("targets") or {}).items() if split != "unlabeled" else ():
                gold = shown(target)
                if gold is not None:
                    data.gold.setdefault(str(schema), {})[iid] = gold
    return data


def scored(data: RunData, schema: str, only: set[str] | None = None) -> list[Scored]:
    """The run's held-out items of `schema` with a gold label (those in `only`, when given), by id."""
    out = []
    for iid, gold in sorted(data.gold.get(schema, {}).items()):
        if only is not None and iid not in only:
            continue
        p = data.predictions.get((iid, schema))
        confidence = p.get("confidence") if p else None
        out.append(
            Scored(
                iid,
                gold,
                shown(label_of(p)) if p else None,
                float(confidence) if isinstance(confidence, (int, float)) else None,
            )
        )
    return out
