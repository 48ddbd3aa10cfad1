"""Measures of held-out predictions: per label, the confusion matrix, McNemar, reliability, a confidence
threshold for a precision. Pure functions over `Scored` items; labels are compared as wire/scoring.py
compares them (label_key), and shown as their text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from potato_queue.wire.scoring import DIGITS

__all__ = [
    "Scored",
    "DEFAULT_TARGET_PRECISION",
    "schema_quality",
    "per_label",
    "confusion",
    "mcnemar",
    "reliability",
    "min_confidence_for",
    "RELIABILITY_BINS",
    "EXACT_BELOW",
]

RELIABILITY_BINS = 10
DEFAULT_TARGET_PRECISION = 0.9
# McNemar: below this many discordant items, the exact binomial test (the chi-squared approximation is poor).
EXACT_BELOW = 25


@dataclass(frozen=True)
class Scored:
    """One held-out item of one schema: its gold label, the predicted one (None: none came back), the
    prediction's confidence (None: the trainer gave none)."""

    instance_id: str
    gold: str
    predicted: str | None
    confidence: float | None

    @property
    def right(self) -> bool:
        return self.predicted == self.gold


def _r(value: float) -> float:
    return round(value, DIGITS)


def _p(value: float) -> float:
    """A p-value to four significant digits: a tiny one stays readable (2.3e-07, not 0.0)."""
    return float(f"{value:.4g}")


def _floor(value: float) -> float:
    """Down to DIGITS: a shown min_confidence never rounds up past the item it must keep."""
    return math.floor(value * 10**DIGITS) / 10**DIGITS


def per_label(items: Sequence[Scored]) -> list[dict[str, Any]]:
    """Precision, recall, F1, support (gold items) and predicted count of every label seen, by label."""
    labels = sorted({i.gold for i in items} | {i.predicted for i in items if i.predicted is not None})
    rows = []
    for label in labels:
        tp = sum(1 for i in items if i.gold == label == i.predicted)
        predicted = sum(1 for i in items if i.predicted == label)
        support = sum(1 for i in items if i.gold == label)
        precision = tp / predicted if predicted else None
        recall = tp / support if support else None
        f1 = 2 * tp / (predicted + support) if predicted + support else None
        rows.append(
            {
                "label": label,
                "precision": None if precision is None else _r(precision),
                "recall": None if recall is None else _r(recall),
                "f1": None if f1 is None else _r(f1),
                "support": support,
                "predicted": predicted,
            }
        )
    return rows


def confusion(items: Sequence[Scored]) -> dict[str, Any]:
    """`counts[g][p]`: items of gold label `labels[g]` predicted `labels[p]`; a missing prediction is the
    column `(none)` when any is missing."""
    none = "(none)"
    labels = sorted({i.gold for i in items} | {i.predicted for i in items if i.predicted is not None})
    columns = labels + ([none] if any(i.predicted is None for i in items) else [])
    at = {label: n for n, label in enumerate(columns)}
    counts = [[0] * len(columns) for _ in labels]
    for i in items:
        counts[at[i.gold]][at[i.predicted if i.predicted is not None else none]] += 1
    return {"labels": labels, "columns": columns, "counts": counts}


def _binomial_two_sided(k: int, n: int) -> float:
    """P(X <= min(k, n-k)) * 2 for X ~ Binomial(n, 1/2), at most 1."""
    low = min(k, n - k)
    return min(1.0, 2 * sum(math.comb(n, j) for j in range(low + 1)) / 2**n)


def mcnemar(a_right: Sequence[bool], b_right: Sequence[bool]) -> dict[str, Any]:
    """McNemar's test of two classifiers on the same items: `only_a` (A right, B wrong) against `only_b`.
    Exact (binomial) under EXACT_BELOW discordant items, else chi-squared with continuity correction."""
    if len(a_right) != len(b_right):
        raise ValueError(f"McNemar needs the same items: {len(a_right)} against {len(b_right)}")
    only_a = sum(1 for a, b in zip(a_right, b_right, strict=True) if a and not b)
    only_b = sum(1 for a, b in zip(a_right, b_right, strict=True) if b and not a)
    n = only_a + only_b
    if n == 0:
        return {"only_a": 0, "only_b": 0, "method": "exact", "statistic": None, "p_value": 1.0}
    if n < EXACT_BELOW:
        return {
            "only_a": only_a,
            "only_b": only_b,
            "method": "exact",
            "statistic": None,
            "p_value": _p(_binomial_two_sided(only_a, n)),
        }
    statistic = max(0, abs(only_a - only_b) - 1) ** 2 / n
    # chi-squared with one degree of freedom: P(X > x) = erfc(sqrt(x / 2))
    return {
        "only_a": only_a,
        "only_b": only_b,
        "method": "chi-squared, continuity-corrected",
        "statistic": _r(statistic),
        "p_value": _p(math.erfc(math.sqrt(statistic / 2))),
    }


def reliability(items: Sequence[Scored], bins: int = RELIABILITY_BINS) -> dict[str, Any]:
    """Confidence against accuracy in `bins` equal-width bins of the confidence, and the expected
    calibration error (the bins' |accuracy - confidence| weighted by their items). Items without a
    confidence are counted apart."""
    rated = [i for i in items if i.confidence is not None and 0 <= i.confidence <= 1]  # the gate refuses others
    rows = []
    ece = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        inside = [i for i in rated if lo <= i.confidence < hi or (b == bins - 1 and i.confidence == 1.0)]  # type: ignore[operator]
        if not inside:
            rows.append({"lo": _r(lo), "hi": _r(hi), "n": 0, "confidence": None, "accuracy": None})
            continue
        confidence = sum(i.confidence for i in inside) / len(inside)  # type: ignore[misc]
        accuracy = sum(i.right for i in inside) / len(inside)
        ece += len(inside) / len(rated) * abs(accuracy - confidence)
        rows.append(
            {"lo": _r(lo), "hi": _r(hi), "n": len(inside), "confidence": _r(confidence), "accuracy": _r(accuracy)}
        )
    return {
        "bins": rows,
        "ece": _r(ece) if rated else None,
        "n": len(rated),
        "without_confidence": len(items) - len(rated),
    }


def min_confidence_for(items: Sequence[Scored], target_precision: float) -> dict[str, Any]:
    """The lowest min_confidence whose kept predictions (confidence at least it) are right at least
    `target_precision` of the time on these items, and what it keeps; `min_confidence` None when no
    threshold reaches it (then `best` says the most precise one)."""
    rated = sorted((i for i in items if i.confidence is not None), key=lambda i: -i.confidence)  # type: ignore[operator]
    found: dict[str, Any] | None = None
    best: dict[str, Any] | None = None
    right = 0
    for n, item in enumerate(rated, 1):
        right += item.right
        if n < len(rated) and rated[n].confidence == item.confidence:
            continue  # a threshold keeps every item of its confidence
        point = {"min_confidence": _floor(item.confidence), "precision": _r(right / n), "kept": n}  # type: ignore[arg-type]
        if best is None or point["precision"] > best["precision"]:
            best = point
        if right / n >= target_precision:
            found = point  # a lower threshold that still reaches it keeps more: the last one wins
    answer = {"target_precision": target_precision, "of": len(rated), **(found or {"min_confidence": None})}
    if found is None:
        answer["best"] = best
    return answer


def schema_quality(items: Sequence[Scored], target_precision: float) -> dict[str, Any]:
    """One schema's quality report: per-label precision and recall, the reliability diagram, the
    min_confidence that keeps precision at `target_precision` on these held-out items."""
    return {
        "n": len(items),
        "per_label": per_label(items),
        "reliability": reliability(items),
        "threshold": min_confidence_for(items, target_precision),
    }
