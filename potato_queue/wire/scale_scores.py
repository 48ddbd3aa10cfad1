"""Held-out scores of a scale: an ordinal scheme (a likert) and a continuous one (a slider, a number).

Standard library only, Python 3.8+ (wire/scoring.py dispatches here by kind). A scale's answers are
numbers, and how far off a prediction is matters as much as whether it is exact:

- `mae`: the mean absolute error, on the scale's own units;
- `spearman`: the rank correlation of the predictions with the answers (ties take their average
  rank; None when either side is constant);
- ordinal only: `accuracy` (exact), `macro_f1` (each point of the scale a class) and `qwk`, Cohen's
  quadratic-weighted kappa over the integer points between the lowest and the highest value seen
  (1 agrees perfectly, 0 is chance; an error of two points costs four times one of one point).

A labelled scale (a likert whose points are named: "Disagree" .. "Agree") is scored on its points'
positions, 1 for the first: `scale_number`.

An item with an answer but no prediction counts as wrong for accuracy and is left out of the
distances, which say how far the predictions that came back were; `n_predicted` says how many.
"""

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["as_number", "labelled", "scale_number", "mae", "spearman", "quadratic_weighted_kappa", "scale_score"]

Pair = Tuple[float, Optional[float]]


def as_number(value: Any) -> Optional[float]:
    """An answer or a prediction on a scale as a number ("4" and 4 alike); None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def labelled(points: Optional[Sequence[Any]]) -> bool:
    """Whether a scale's points are names rather than numbers (a likert with labels)."""
    return bool(points) and any(as_number(p) is None for p in points or ())


def scale_number(value: Any, points: Optional[Sequence[Any]] = None) -> Optional[float]:
    """An answer or a prediction as a number on its scale: a labelled scale's point by its position (1 for
    the first; None for a name not on it), any other scale's as the number it is."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if labelled(points):
        names = [str(p) for p in points or ()]
        return float(names.index(str(value)) + 1) if str(value) in names else None
    return as_number(value)


def mae(gold: Sequence[float], predicted: Sequence[float]) -> float:
    return sum(abs(g - p) for g, p in zip(gold, predicted)) / float(len(gold))  # noqa: B905 - same length


def _ranks(values: Sequence[float]) -> List[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return ranks


def spearman(gold: Sequence[float], predicted: Sequence[float]) -> Optional[float]:
    """Pearson's correlation of the average ranks; None for fewer than two items or a constant side."""
    if len(gold) < 2:
        return None
    a, b = _ranks(gold), _ranks(predicted)
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b))  # noqa: B905 - same length
    var_a, var_b = sum((x - mean_a) ** 2 for x in a), sum((y - mean_b) ** 2 for y in b)
    return cov / math.sqrt(var_a * var_b) if var_a and var_b else None


def quadratic_weighted_kappa(gold: Sequence[int], predicted: Sequence[int]) -> Optional[float]:
    """Cohen's kappa with weights (i - j)^2 over the integer points from the lowest value to the highest."""
    low, high = min(min(gold), min(predicted)), max(max(gold), max(predicted))
    if low == high:
        return 1.0  # one point only, and every prediction on it
    points, n = high - low + 1, float(len(gold))
    observed = [[0.0] * points for _ in range(points)]
    for g, p in zip(gold, predicted):  # noqa: B905 - same length
        observed[g - low][p - low] += 1
    rows = [sum(observed[i]) for i in range(points)]
    columns = [sum(observed[i][j] for i in range(points)) for j in range(points)]
    weight = [[(i - j) ** 2 for j in range(points)] for i in range(points)]
    disagreement = sum(weight[i][j] * observed[i][j] for i in range(points) for j in range(points))
    chance = sum(weight[i][j] * rows[i] * columns[j] / n for i in range(points) for j in range(points))
    return 1.0 - disagreement / chance if chance else None


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else float(round(value, 4))


def scale_score(pairs: List[Pair], ordinal: bool, macro_f1: Any) -> Dict[str, Any]:
    """The scores of one split (`pairs`: each answered item's answer and prediction, None when none came
    back); `macro_f1`: wire/scoring.py's, over (gold, predicted) class keys."""
    came = [(g, p) for g, p in pairs if p is not None]
    gold, predicted = [g for g, _ in came], [p for _, p in came]
    out = {
        "n": len(pairs),
        "n_predicted": len(came),
        "mae": _round(mae(gold, predicted)) if came else None,
        "spearman": _round(spearman(gold, predicted)) if came else None,
    }  # type: Dict[str, Any]
    if not ordinal:
        return {"accuracy": None, "macro_f1": None, **out}
    points = [(int(round(g)), None if p is None else int(round(p))) for g, p in pairs]
    exact = sum(1 for g, p in points if g == p)
    hits = [(g, p) for g, p in points if p is not None]
    kappa = quadratic_weighted_kappa([g for g, _ in hits], [p for _, p in hits]) if hits else None
    keys = [(str(g), None if p is None else str(p)) for g, p in points]
    return {
        "accuracy": _round(exact / float(len(points))),
        "macro_f1": _round(macro_f1(keys)),
        **out,
        "qwk": _round(kappa),
    }
