"""Held-out scores of a span scheme (kind `span`: named entities, highlighted evidence), entity by entity.

Standard library only, Python 3.8+ (wire/scoring.py dispatches here by kind). An item's answer and its
prediction are lists of spans, each ``{"start", "end", "label"}`` (Potato's own spans name their label
``name``; both are read) over the item's text, ``end`` exclusive. A predicted span is right:

- exactly, when a gold span of the same item has its label, start and end (`precision`, `recall`, `f1`);
- partly, when a gold span of the same label overlaps it by a character at least (`partial_precision`,
  `partial_recall`, `partial_f1`; each gold span matched once, each predicted span once).

`per_label_f1` is each label's exact F1 and `macro_f1` their mean, so the tables that show macro-F1 read
the same for every kind; `accuracy` is the share of items whose spans are all exactly right. An item
with an answer but no prediction counts as predicting no span.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["Span", "as_spans", "span_score"]

Span = Tuple[int, int, str]
DIGITS = 4


def as_spans(value: Any) -> List[Span]:
    """An answer or a prediction as (start, end, label) spans, in order (anything not a span is left out)."""
    spans = []
    for entry in [value] if isinstance(value, dict) else value if isinstance(value, list) else []:  # one span alone
        if not isinstance(entry, dict):
            continue
        label = entry.get("label", entry.get("name"))
        try:
            start, end = int(entry["start"]), int(entry["end"])
        except (KeyError, TypeError, ValueError):
            continue
        if isinstance(label, str) and end > start >= 0:
            spans.append((start, end, label))
    return sorted(set(spans))


def _f1(tp: int, predicted: int, gold: int) -> Tuple[float, float, float]:
    precision = tp / float(predicted) if predicted else 0.0
    recall = tp / float(gold) if gold else 0.0
    return precision, recall, (2 * precision * recall / (precision + recall) if precision + recall else 0.0)


def _partial_hits(gold: Sequence[Span], predicted: Sequence[Span]) -> int:
    """Pairs of a predicted and a gold span of one label that overlap, each span in one pair at most."""
    taken = set()  # type: set
    hits = 0
    for start, end, label in predicted:
        match = next(
            (i for i, (s, e, lab) in enumerate(gold) if i not in taken and lab == label and s < end and start < e), None
        )
        if match is not None:
            taken.add(match)
            hits += 1
    return hits


def _round(value: float) -> float:
    return float(round(value, DIGITS))


def span_score(pairs: List[Tuple[List[Span], Optional[List[Span]]]]) -> Dict[str, Any]:
    """The scores of one split: `pairs` holds each answered item's gold spans and predicted ones (None: no
    prediction came back)."""
    labels = sorted({s[2] for gold, predicted in pairs for s in gold + (predicted or [])})
    n_gold = sum(len(gold) for gold, _ in pairs)
    n_predicted = sum(len(predicted or []) for _, predicted in pairs)
    exact = sum(len(set(gold) & set(predicted or [])) for gold, predicted in pairs)
    partial = sum(_partial_hits(gold, predicted or []) for gold, predicted in pairs)
    per_label = {}
    for label in labels:
        hits = sum(len({s for s in gold if s[2] == label} & set(predicted or [])) for gold, predicted in pairs)
        per_label[label] = _f1(
            hits,
            sum(1 for _, p in pairs for s in p or [] if s[2] == label),
            sum(1 for g, _ in pairs for s in g if s[2] == label),
        )[2]
    precision, recall, f1 = _f1(exact, n_predicted, n_gold)
    p_partial, r_partial, f1_partial = _f1(partial, n_predicted, n_gold)
    whole = sum(1 for gold, predicted in pairs if set(gold) == set(predicted or []))
    return {
        "accuracy": _round(whole / float(len(pairs))),
        "macro_f1": _round(sum(per_label.values()) / len(per_label)) if per_label else 0.0,
        "precision": _round(precision),
        "recall": _round(recall),
        "f1": _round(f1),
        "partial_precision": _round(p_partial),
        "partial_recall": _round(r_partial),
        "partial_f1": _round(f1_partial),
        "per_label_f1": {k: _round(v) for k, v in per_label.items()},
        "n": len(pairs),
        "n_spans": n_gold,
    }
