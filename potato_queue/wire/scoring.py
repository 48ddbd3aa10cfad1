"""Held-out scores (accuracy, macro-F1): the one scorer, standard library only.

The worker scores val and test from the predictions it wrote (its metric
events), and the server scores the same splits from the predictions that
came back (the run's held_out), with this same code: the same predictions
give the same numbers, whatever the trainer or the backend (TRN-3).

Nominal labels are compared as canonical JSON. A multilabel scheme (kind
`multilabel`: a multiselect) is scored as sets of labels: `accuracy` is the
subset accuracy (the whole set right), `macro_f1` the mean of each label's
F1, `micro_f1` the F1 over every label decision pooled, and `per_label_f1`
each label's own; so the tables that show accuracy and macro-F1 read the
same for every kind. An item without a gold label is not scored; an item
with a gold label but no prediction counts as wrong (an empty set, for
multilabel). An ordinal or continuous scheme (a likert, a slider) is scored
by distance too: scale_scores.py; a span scheme entity by entity: span_scores.py.
"""

import json
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

from .scale_scores import scale_number, scale_score
from .span_scores import as_spans, span_score

__all__ = [
    "accuracy",
    "macro_f1",
    "gold_label",
    "label_key",
    "label_set",
    "score",
    "DIGITS",
    "MULTILABEL",
    "ORDINAL",
    "SCALE_KINDS",
    "SPAN",
]

DIGITS = 4
MULTILABEL = "multilabel"
ORDINAL = "ordinal"
# Answers on a scale, scored by how far off they are (scale_scores.py).
SCALE_KINDS = (ORDINAL, "continuous")
SPAN = "span"
Pair = Tuple[Optional[str], Optional[str]]


def gold_label(target: Any) -> Any:
    """A target as scored: a one-element list is its element; empty means there is no gold label (None)."""
    if isinstance(target, list) and len(target) == 1:
        target = target[0]
    return None if target in (None, "", []) else target


def label_key(label: Any) -> Optional[str]:
    """The text two labels are compared by (None for no label)."""
    label = gold_label(label)
    return None if label is None else json.dumps(label, sort_keys=True, ensure_ascii=False)


def _keyed(gold: List[Any], predicted: List[Any]) -> List[Pair]:
    if len(gold) != len(predicted):
        raise ValueError("gold and predicted differ in length (%d vs %d)" % (len(gold), len(predicted)))
    return [(label_key(gold[i]), label_key(predicted[i])) for i in range(len(gold))]


def accuracy(gold: List[Any], predicted: List[Any]) -> float:
    """The share of positions where *predicted* equals *gold*."""
    pairs = _keyed(gold, predicted)
    return sum(1 for g, p in pairs if g == p) / float(len(pairs)) if pairs else 0.0


def _macro_f1(pairs: List[Pair]) -> float:
    labels = {g for g, _ in pairs} | {p for _, p in pairs if p is not None}
    scores = []
    for label in labels:
        tp = sum(1 for g, p in pairs if g == label == p)
        fp = sum(1 for g, p in pairs if p == label != g)
        fn = sum(1 for g, p in pairs if g == label != p)
        scores.append(2.0 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(scores) / len(scores) if scores else 0.0


def macro_f1(gold: List[Any], predicted: List[Any]) -> float:
    """Unweighted mean F1 over every label seen in *gold* or *predicted*."""
    return _macro_f1(_keyed(gold, predicted))


def label_set(label: Any) -> FrozenSet[str]:
    """A multilabel answer or prediction as a set (a lone label is a set of one; nothing is the empty set)."""
    if label is None or label == "":
        return frozenset()
    return frozenset(str(x) for x in label) if isinstance(label, list) else frozenset([str(label)])


def _f1(tp: int, fp: int, fn: int) -> float:
    return 2.0 * tp / (2 * tp + fp + fn) if tp else 0.0


def _multilabel_score(pairs: List[Tuple[FrozenSet[str], FrozenSet[str]]]) -> Dict[str, Any]:
    labels = sorted(set().union(*(gold | predicted for gold, predicted in pairs)))
    per_label, pooled = {}, [0, 0, 0]  # type: Dict[str, float], List[int]
    for label in labels:
        counts = [
            sum(1 for g, p in pairs if (label in g, label in p) == want)
            for want in ((True, True), (False, True), (True, False))
        ]
        per_label[label] = _f1(*counts)
        pooled = [pooled[i] + counts[i] for i in range(3)]
    return {
        "accuracy": round(sum(1 for g, p in pairs if g == p) / float(len(pairs)), DIGITS),
        "macro_f1": round(sum(per_label.values()) / len(per_label), DIGITS) if per_label else 0.0,
        "micro_f1": round(_f1(*pooled), DIGITS),
        "per_label_f1": {label: round(f1, DIGITS) for label, f1 in per_label.items()},
        "n": len(pairs),
    }


def score(
    targets: Dict[str, Any], predicted: Dict[str, Any], kind: str = "nominal", points: Optional[List[Any]] = None
) -> Dict[str, Any]:
    """``{"accuracy", "macro_f1", "n"}`` of one split of one schema (None scores when nothing to score); for a
    multilabel scheme also ``micro_f1`` and ``per_label_f1``; for a scale the distances (scale_scores.py).

    *targets* maps item id to its gold label, *predicted* item id to the predicted label; *points*: an
    ordinal scale's points in order (the bundle's scales.json), which a labelled likert needs.
    """
    if kind == MULTILABEL:
        sets = [(label_set(t), label_set(predicted.get(item))) for item, t in targets.items() if label_set(t)]
        return _multilabel_score(sets) if sets else {"accuracy": None, "macro_f1": None, "n": 0}
    if kind == SPAN:
        spans = [(as_spans(t), as_spans(predicted[item]) if item in predicted else None) for item, t in targets.items()]
        answered = [(g, p) for g, p in spans if g]
        return span_score(answered) if answered else {"accuracy": None, "macro_f1": None, "n": 0}
    if kind in SCALE_KINDS:
        numbers = [(scale_number(t, points), scale_number(predicted.get(item), points)) for item, t in targets.items()]
        answered = [(g, p) for g, p in numbers if g is not None]
        return (
            scale_score(answered, kind == ORDINAL, _macro_f1)
            if answered  # type: ignore[arg-type]
            else {"accuracy": None, "macro_f1": None, "n": 0}
        )
    pairs = [(label_key(t), label_key(predicted.get(item))) for item, t in targets.items() if gold_label(t) is not None]
    if not pairs:
        return {"accuracy": None, "macro_f1": None, "n": 0}
    correct = sum(1 for g, p in pairs if g == p)
    return {
        "accuracy": round(correct / float(len(pairs)), DIGITS),
        "macro_f1": round(_macro_f1(pairs), DIGITS),
        "n": len(pairs),
    }
