"""Held-out scores (accuracy, macro-F1) from predictions, standard library only.

The worker scores the val and test splits from the predictions it wrote, the
same way for every trainer, so a run's metrics mean the same thing whichever
trainer or backend produced them.
"""

from typing import Any, Dict, Iterable, List, Optional, Tuple

__all__ = ["accuracy", "macro_f1", "score_pairs"]

Pair = Tuple[Any, Any]


def _pairs(gold: List[Any], predicted: List[Any]) -> List[Pair]:
    if len(gold) != len(predicted):
        raise ValueError("gold and predicted differ in length (%d vs %d)" % (len(gold), len(predicted)))
    return [(gold[i], predicted[i]) for i in range(len(gold))]


def accuracy(gold: List[Any], predicted: List[Any]) -> float:
    """The share of positions where *predicted* equals *gold* (as strings)."""
    pairs = _pairs(gold, predicted)
    if not pairs:
        return 0.0
    return sum(1 for g, p in pairs if str(g) == str(p)) / float(len(pairs))


def macro_f1(gold: List[Any], predicted: List[Any]) -> float:
    """Unweighted mean F1 over every label seen in *gold* or *predicted*."""
    pairs = [(str(g), str(p)) for g, p in _pairs(gold, predicted)]
    labels = sorted({g for g, _ in pairs} | {p for _, p in pairs})
    if not labels:
        return 0.0
    scores = []
    for label in labels:
        tp = sum(1 for g, p in pairs if g == label and p == label)
        fp = sum(1 for g, p in pairs if g != label and p == label)
        fn = sum(1 for g, p in pairs if g == label and p != label)
        denominator = 2 * tp + fp + fn
        scores.append(2.0 * tp / denominator if denominator else 0.0)
    return sum(scores) / len(scores)


def score_pairs(pairs: Iterable[Pair]) -> Optional[Dict[str, float]]:
    """``{"accuracy", "macro_f1", "n"}`` over ``(gold, predicted)`` pairs; None when empty."""
    gold: List[Any] = []
    predicted: List[Any] = []
    for g, p in pairs:
        gold.append(g)
        predicted.append(p)
    if not gold:
        return None
    return {"accuracy": accuracy(gold, predicted), "macro_f1": macro_f1(gold, predicted), "n": float(len(gold))}
