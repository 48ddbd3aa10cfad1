"""Held-out scores (accuracy, macro-F1): the one scorer, standard library only.

The worker scores val and test from the predictions it wrote (its metric
events), and the server scores the same splits from the predictions that
came back (the run's held_out), with this same code: the same predictions
give the same numbers, whatever the trainer or the backend (TRN-3).

Labels are compared as canonical JSON, so a multilabel target (a list) is
one label, and a one-element list is its element. An item without a gold
label is not scored; an item with a gold label but no prediction counts as
wrong.
"""

import json
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["accuracy", "macro_f1", "gold_label", "label_key", "score", "DIGITS"]

DIGITS = 4
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


def score(targets: Dict[str, Any], predicted: Dict[str, Any]) -> Dict[str, Any]:
    """``{"accuracy", "macro_f1", "n"}`` of one split of one schema (None scores when nothing to score).

    *targets* maps item id to its gold label, *predicted* item id to the predicted label.
    """
    pairs = [(label_key(t), label_key(predicted.get(item))) for item, t in targets.items() if gold_label(t) is not None]
    if not pairs:
        return {"accuracy": None, "macro_f1": None, "n": 0}
    correct = sum(1 for g, p in pairs if g == p)
    return {"accuracy": round(correct / float(len(pairs)), DIGITS), "macro_f1": round(_macro_f1(pairs), DIGITS),
            "n": len(pairs)}
