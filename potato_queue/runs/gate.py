"""Which predictions count, and which become prelabels: Potato's rules, applied the way Potato applies them.

A prediction is *refused* (named in run.log, never stored or published) when it cannot be one of
this run's: an item not in the run's bundle, a schema the run did not train, a label outside the
schema, a confidence that is not a number in [0, 1]. A valid prediction is stored; it is
*published* as a prelabel only when it passes Potato 2.12's four rules, in its order: the item is
in no run's train split (the leak guard), the schema is in writeback.schemas, no reviewer
rejected it, and its confidence is at least writeback.min_confidence (a missing one passes).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from potato_queue.config import ProjectConfig
from potato_queue.runs.checks import MAX_SPANS_PER_ITEM, value_problem
from potato_queue.schemes import ROW_OF
from potato_queue.wire.files import read_jsonl
from potato_queue.wire.scales_file import ScalesError, read_scales

__all__ = [
    "BUNDLE_SPLITS",
    "HELD_OUT_SPLITS",
    "held_out_ids",
    "Refusal",
    "PublishRules",
    "bundle_split_ids",
    "bundle_summary",
    "refusals",
    "publishable",
    "schema_kinds",
    "label_of",
    "potato_cannot_show",
    "UNSHOWN",
]

BUNDLE_SPLITS = ("train", "val", "test", "unlabeled")
HELD_OUT_SPLITS = ("val", "test")
# Kinds whose labels come from a closed vocabulary, so a foreign label can be told.
_VOCABULARY_KINDS = ("nominal", "multilabel")


# What Potato 2.12.1 pre-fills nothing from, whatever the payload (docs/potato-prelabels.md): its prefill
# writes a numeric likert's and a number field's value under the key `slider`, which neither has, and has
# no branch for a select.
_UNSHOWN_TYPES = {
    "number": "a number field",
    "select": "a select (a dropdown)",
    # Its pre-annotation branch covers radio, multiselect, text, likert, slider, number, spans and shapes only.
    "pairwise": "a pairwise comparison",
    "triage": "a triage decision",
    "vas": "a visual analogue scale",
    "confidence": "a confidence rating",
    "hierarchical_multiselect": "a hierarchical multiselect",
}
UNSHOWN = "Potato cannot pre-fill the scheme"


def potato_cannot_show(scheme: Mapping[str, Any]) -> str | None:
    """Why Potato 2.12.1 cannot pre-fill *scheme* from any prediction (None: it can)."""
    atype = str(scheme.get("annotation_type") or "").strip().lower()
    if scheme.get(ROW_OF):  # a multirate's row (schemes.with_rows): a scheme Potato's config does not have
        return "Potato 2.12.1 pre-fills nothing of a multirate's rows from a prediction"
    if atype == "likert" and not scheme.get("labels"):
        return (
            "Potato 2.12.1 pre-fills no likert without labels (its points have no names to match); give the "
            "likert labels: to have its predictions pre-filled"
        )
    if atype in _UNSHOWN_TYPES:
        return f"Potato 2.12.1 pre-fills nothing of {_UNSHOWN_TYPES[atype]} from a prediction"
    return None


def label_of(prediction: Mapping[str, Any]) -> Any:
    """A prediction's label: its payload's; a multiselect's payload (a list of {label, confidence}) gives
    the list of labels; a span scheme's (a list of {start, end, label, ...}) is its spans; a bare payload
    is the label itself."""
    payload = prediction.get("payload")
    if isinstance(payload, list) and all(isinstance(x, dict) for x in payload):
        if payload and all("start" in x and "end" in x for x in payload):
            return payload
        return [x.get("label") for x in payload]
    return payload.get("label") if isinstance(payload, dict) else payload


def bundle_split_ids(bundle_dir: Path) -> dict[str, list[str]]:
    """Each split's item ids, in the bundle's order (an absent split file is an empty split)."""
    return {
        split: [
            str(row.get("instance_id"))
            for _, row in read_jsonl(bundle_dir / f"{split}.jsonl", not_json="skip", missing_ok=True)
            if isinstance(row, dict)
        ]
        for split in BUNDLE_SPLITS
    }


def held_out_ids(bundle_dir: Path) -> set[str]:
    """The ids of a bundle's held-out items (val and test): where a run may fairly be compared."""
    return {
        str(row.get("instance_id"))
        for split in HELD_OUT_SPLITS
        for _, row in read_jsonl(bundle_dir / f"{split}.jsonl", not_json="skip", missing_ok=True)
        if isinstance(row, dict)
    }


def _manifest(bundle_dir: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((bundle_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def schema_kinds(bundle_dir: Path) -> dict[str, str]:
    """Each scheme's kind as the run's bundle recorded it (how its predictions are scored)."""
    return {
        str(s.get("name")): str(s.get("kind") or "nominal")
        for s in _manifest(bundle_dir).get("schemas") or []
        if isinstance(s, dict)
    }


def bundle_summary(bundle_dir: Path, split_ids: dict[str, list[str]]) -> dict[str, Any]:
    """What a run's record keeps of its bundle: the digest, each schema's kind, each split's size."""
    manifest = _manifest(bundle_dir)
    return {
        "digest": manifest.get("digest") or "",
        "n": {split: len(ids) for split, ids in split_ids.items()},
        "kinds": [str(s.get("kind")) for s in manifest.get("schemas") or [] if isinstance(s, dict)],
    }


def _allowed_labels(config: ProjectConfig, bundle_dir: Path) -> dict[str, tuple[str, set[str]]]:
    """{schema: (kind, labels)}: the labels observed in the bundle and those the project's scheme offers."""
    manifest = _manifest(bundle_dir)
    offered: dict[str, set[str]] = {}
    for scheme in config.annotation_schemes:
        names = {str(x.get("name") if isinstance(x, dict) else x) for x in scheme.get("labels") or []}
        offered[str(scheme.get("name"))] = names
    return {
        str(s.get("name")): (
            str(s.get("kind")),
            set(map(str, s.get("labels") or [])) | offered.get(str(s.get("name")), set()),
        )
        for s in manifest.get("schemas") or []
        if isinstance(s, dict)
    }


@dataclass(frozen=True)
class Refusal:
    line: int  # the prediction's position among the run's predictions, from 1
    instance_id: str
    schema: str
    why: str

    def said(self) -> str:
        return f"#{self.line} ({self.instance_id!r}, {self.schema!r}): {self.why}"


def _bad_confidence(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return math.isnan(value) or not 0.0 <= value <= 1.0


def _label_problem(label: Any, kind: str, labels: set[str]) -> str | None:
    if kind not in _VOCABULARY_KINDS or not labels:
        return None
    given = label if kind == "multilabel" and isinstance(label, list) else [label]
    foreign = [x for x in given if not isinstance(x, str) or x not in labels]
    if foreign:
        return f"label {foreign[0]!r} is not one of the schema's labels ({', '.join(sorted(labels))})"
    return None


@dataclass(frozen=True)
class _RunBundle:
    """What a run's predictions are checked against: its bundle's items (with their texts' lengths, for
    spans), and each trained scheme's kind, labels and scale."""

    text_lengths: dict[str, int]
    schemas: dict[str, tuple[str, set[str]]]
    scales: dict[str, dict[str, Any]]


def _problem(p: dict[str, Any], run: _RunBundle) -> str | None:
    payload = p.get("payload")
    label = label_of(p)
    iid, schema = str(p["instance_id"]), p["schema_name"]
    if iid not in run.text_lengths:
        return "the item is not in the run's bundle"
    if schema not in run.schemas:
        return f"the run did not train schema {schema!r} (it trained {', '.join(sorted(run.schemas))})"
    entries = [payload] if isinstance(payload, dict) else payload if isinstance(payload, list) else []
    if len(entries) > MAX_SPANS_PER_ITEM:
        return f"{len(entries)} entries for one item; at most {MAX_SPANS_PER_ITEM} are taken"
    confidences = [p.get("confidence")] + [x.get("confidence") for x in entries if isinstance(x, dict)]
    bad = next((c for c in confidences if _bad_confidence(c)), None)
    if bad is not None:
        return f"confidence {bad!r} is not a number in [0, 1]"
    kind, labels = run.schemas[schema]
    return _label_problem(label, kind, labels) or value_problem(
        kind, label, payload, labels, run.scales.get(schema), run.text_lengths[iid]
    )


def _text_lengths(bundle_dir: Path) -> dict[str, int]:
    """Each bundle item's text length (what a span's offsets index)."""
    return {
        str(row.get("instance_id")): len(str(row.get("text") or ""))
        for split in BUNDLE_SPLITS
        for _, row in read_jsonl(bundle_dir / f"{split}.jsonl", not_json="skip", missing_ok=True)
        if isinstance(row, dict)
    }


def _scales(bundle_dir: Path) -> dict[str, dict[str, Any]]:
    try:
        return read_scales(str(bundle_dir))
    except ScalesError:
        return {}  # a scale then checks nothing more than its kind: the scoring says what it cannot read


def refusals(
    config: ProjectConfig, bundle_dir: Path, predictions: list[dict[str, Any]], schemas: Iterable[str]
) -> tuple[list[dict[str, Any]], list[Refusal]]:
    """(the valid predictions, the refused ones with why) against the run's own bundle: its items, the
    schemes it trained, each kind's values (runs/checks.py)."""
    trained = set(schemas)
    allowed = {name: v for name, v in _allowed_labels(config, bundle_dir).items() if name in trained}
    run = _RunBundle(_text_lengths(bundle_dir), allowed, _scales(bundle_dir))
    valid, refused = [], []
    for number, p in enumerate(predictions, 1):
        why = _problem(p, run)
        if why is None:
            valid.append(p)
        else:
            refused.append(Refusal(number, str(p["instance_id"]), str(p["schema_name"]), why))
    return valid, refused


@dataclass
class PublishRules:
    """Potato's four rules with their inputs, and an empty set of labels kept off; `skipped` counts what
    each kept off."""

    train_ids: set[str]
    schemas: set[str]
    rejected: set[tuple[str, str]]
    min_confidence: float
    #: {scheme: why}: the schemes Potato pre-fills nothing from (their predictions are stored, not published).
    unshown: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            (
                "train split",
                "schema not enabled",
                UNSHOWN,
                "rejected by a reviewer",
                "below min_confidence",
                "no label in the set",
            ),
            0,
        )
    )

    def why_not(self, p: dict[str, Any]) -> str | None:
        item, schema, confidence = str(p.get("instance_id")), str(p.get("schema_name")), p.get("confidence")
        if item in self.train_ids:
            return "train split"
        if schema not in self.schemas:
            return "schema not enabled"
        if schema in self.unshown:
            return UNSHOWN
        if (item, schema) in self.rejected:
            return "rejected by a reviewer"
        if confidence is not None and float(confidence) < self.min_confidence:
            return "below min_confidence"
        if p.get("payload") == []:  # a multiselect predicted with no label: nothing for Potato to pre-fill
            return "no label in the set"
        return None


def publishable(rules: PublishRules, candidates: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in candidates:
        why = rules.why_not(p)
        if why is None:
            out.append(p)
        else:
            rules.skipped[why] += 1
    return out
