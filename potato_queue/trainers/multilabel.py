"""Multi-label schemes (a multiselect: kind `multilabel`), the parts every trainer of them shares.

One sigmoid (or one binary classifier) per label; each label's threshold is the one that gives that
label the best F1 on the val split (0.5 where val has no positive of it, or no val at all), so a rare
label is not drowned by a fixed 0.5. A prediction is the set of labels at or over their thresholds,
in the vocabulary's order, with every label's probability in `scores`; its confidence is the least
sure of its label decisions (p for a label it chose, 1 - p for one it left out), so a floor on
confidence (write-back's min_confidence) holds for every label of the set.

Pure Python over lists of floats: the trainers hand in their probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from potato_queue.trainers.common import schema_labels, validate_nominal
from potato_queue.wire.scoring import MULTILABEL, SCALE_KINDS
from potato_queue.worker.api import Prediction, RunContext
from potato_queue.worker.bundle import Bundle
from potato_queue.worker.spec import SchemaSpec

__all__ = [
    "DEFAULT_THRESHOLD",
    "chosen_labels",
    "labelled_sets",
    "choose_thresholds",
    "set_prediction",
    "validate_multilabel",
    "validate_by_kind",
]

DEFAULT_THRESHOLD = 0.5
SCORE_DIGITS = 4


def chosen_labels(row: dict[str, Any], schema: str) -> list[str]:
    """A bundle row's set of labels for *schema* (a lone label is a set of one; none is empty)."""
    target = (row.get("targets") or {}).get(schema)
    return [str(x) for x in target] if isinstance(target, list) else [] if target in (None, "") else [str(target)]


def labelled_sets(bundle: Bundle, split: str, schema: str) -> tuple[list[str], list[list[str]]]:
    """``(texts, label lists)`` of the rows of *split* whose answer for *schema* is a non-empty set."""
    texts: list[str] = []
    sets: list[list[str]] = []
    for row in bundle.read_split(split):
        chosen = chosen_labels(row, schema)
        if chosen:
            texts.append(str(row.get("text") or ""))
            sets.append(chosen)
    return texts, sets


def _best_threshold(probabilities: Sequence[float], positive: Sequence[bool]) -> float:
    """The threshold with the best F1 for one label; of equal ones, the nearest to 0.5."""
    if not any(positive):
        return DEFAULT_THRESHOLD
    best = (-1.0, 0.0, DEFAULT_THRESHOLD)  # (F1, -distance from 0.5, threshold)
    for threshold in sorted(set(probabilities) | {DEFAULT_THRESHOLD}):
        tp = sum(1 for p, y in zip(probabilities, positive) if p >= threshold and y)  # noqa: B905 - same length
        fp = sum(1 for p, y in zip(probabilities, positive) if p >= threshold and not y)  # noqa: B905
        fn = sum(1 for p, y in zip(probabilities, positive) if p < threshold and y)  # noqa: B905
        f1 = 2.0 * tp / (2 * tp + fp + fn) if tp else 0.0
        candidate = (f1, -abs(threshold - DEFAULT_THRESHOLD), threshold)
        best = max(best, candidate)
    return best[2]


def choose_thresholds(
    labels: Sequence[str], probabilities: Sequence[Sequence[float]], gold: Sequence[Sequence[str]]
) -> dict[str, float]:
    """Each label's threshold from the val rows' probabilities (one row per item, in `labels` order) and
    their gold sets."""
    return {
        label: round(_best_threshold([row[j] for row in probabilities], [label in g for g in gold]), 6)
        for j, label in enumerate(labels)
    }


def set_prediction(
    instance_id: str, schema: str, labels: Sequence[str], probabilities: Sequence[float], thresholds: dict[str, float]
) -> Prediction:
    """The labels at or over their thresholds, in `labels` order, each label's probability as its score."""
    values = [float(p) for p in probabilities]
    chosen = [label for label, p in zip(labels, values) if p >= thresholds.get(label, DEFAULT_THRESHOLD)]  # noqa: B905
    sure = [p if label in chosen else 1.0 - p for label, p in zip(labels, values)]  # noqa: B905
    scores = {str(label): round(p, SCORE_DIGITS) for label, p in zip(labels, values)}  # noqa: B905
    return Prediction(instance_id, schema, chosen, min(sure) if sure else None, scores)


def validate_multilabel(ctx: RunContext, schema: SchemaSpec, min_train: int = 2) -> list[str]:
    """Problems that stop a per-label classifier from training *schema* on this bundle."""
    if len(schema_labels(ctx, schema)) < 2:
        return [f"Schema '{schema.name}' has fewer than two labels in the bundle"]
    _, sets = labelled_sets(ctx.bundle, "train", schema.name)
    if len(sets) < min_train:
        return [f"Schema '{schema.name}' has {len(sets)} labelled train item(s); at least {min_train} are needed"]
    return []


def validate_by_kind(ctx: RunContext, min_train: int = 2) -> list[str]:
    """What stops a classifier of nominal and multilabel schemes: each scheme checked as its kind is (a
    scale's checks are trainers/scales.py's)."""
    nominal = [s for s in ctx.schemas if s.kind != MULTILABEL and s.kind not in SCALE_KINDS]
    return validate_nominal(ctx, min_train=min_train, schemas=nominal) + [
        problem for s in ctx.schemas if s.kind == MULTILABEL for problem in validate_multilabel(ctx, s, min_train)
    ]
