"""Scale schemes (a likert: kind `ordinal`; a slider or a number field: `continuous`), the parts every trainer
of them shares.

An ordinal scheme's answers are points in an order, and a prediction two points off is worse than one
point off; a classifier over the points throws that order away. So an ordinal scale of K points is coded
as K-1 yes/no answers, "above point k" (Frank and Hall's cumulative coding; a network's head of K-1
sigmoids trained with binary cross-entropy is the same idea as CORAL's), and read back as a distribution
over the points: P(point k) = P(above k-1) - P(above k), the cumulative answers first made monotone. The
prediction is the median point (the one where P(above) crosses 0.5), which minimises the expected
distance; its confidence is that point's probability and `scores` every point's.

A continuous scheme is a regression on the answers, standardised to mean 0 and variance 1 while it
trains; a prediction is put back on the scale's units, clipped to its bounds and snapped to its step. It
carries no confidence (nothing here gives one), so min_confidence does not hold it back.

The points and bounds come from the bundle's scales.json (the project's config); a bundle without one (a
bundle Potato built) gives the points answered in train, and the bounds of the answers.

Pure Python over lists of floats: the trainers hand in their outputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Union

from potato_queue.trainers.pairs import model_input
from potato_queue.wire.scale_scores import as_number, labelled
from potato_queue.wire.scoring import ORDINAL, SCALE_KINDS
from potato_queue.worker.api import Prediction, RunContext
from potato_queue.worker.bundle import Bundle
from potato_queue.worker.spec import SchemaSpec

__all__ = [
    "labelled_values",
    "OrdinalScale",
    "ContinuousScale",
    "Scale",
    "scale_for",
    "scale_from_dict",
    "validate_scale",
    "validate_scales",
]

SCORE_DIGITS = 4
VALUE_DIGITS = 6


def labelled_values(bundle: Bundle, split: str, schema: str, paired: bool = False) -> tuple[list[str], list[Any]]:
    """``(texts, answers)`` of the rows of *split* that answered *schema* (a one-element list is its element;
    `paired`: a pairwise scale's rows as their two texts, trainers/pairs.py)."""
    texts: list[str] = []
    answers: list[Any] = []
    for row in bundle.read_split(split):
        answer = (row.get("targets") or {}).get(schema)
        if isinstance(answer, list):
            answer = answer[0] if len(answer) == 1 else None
        if answer not in (None, ""):
            texts.append(model_input(row, paired))
            answers.append(answer)
    return texts, answers


def _plain(number: float) -> float | int:
    """A whole number as an int (4, not 4.0): a scale's own values are written as the config writes them."""
    return int(number) if float(number).is_integer() else round(number, VALUE_DIGITS)


class OrdinalScale:
    """An ordinal scheme's points in order, coded as K-1 cumulative yes/no answers ("above point k")."""

    kind = ORDINAL

    def __init__(self, points: Sequence[Any]) -> None:
        self.points = [str(p) if labelled(points) else _plain(float(p)) for p in points]

    @property
    def outputs(self) -> list[str]:
        """The names of the K-1 yes/no answers."""
        return [f"above {p}" for p in self.points[:-1]]

    def index(self, answer: Any) -> int | None:
        """The position of *answer* on the scale (None: not one of its points)."""
        if labelled(self.points):
            return self.points.index(str(answer)) if str(answer) in self.points else None
        number = as_number(answer)
        return next((i for i, p in enumerate(self.points) if number is not None and float(p) == number), None)

    def target(self, answer: Any) -> list[float] | None:
        """*answer* as its K-1 yes/no answers (None when it is not on the scale)."""
        at = self.index(answer)
        return None if at is None else [1.0 if at > k else 0.0 for k in range(len(self.points) - 1)]

    def point_probabilities(self, above: Sequence[float]) -> list[float]:
        """Each point's probability from the K-1 P(above point k), made monotone first."""
        monotone, ceiling = [], 1.0
        for p in above:
            ceiling = min(ceiling, max(0.0, float(p)))
            monotone.append(ceiling)
        edges = [1.0] + monotone + [0.0]
        return [edges[k] - edges[k + 1] for k in range(len(self.points))]

    def prediction(self, instance_id: str, schema: str, above: Sequence[float]) -> Prediction:
        """The median point, its probability as the confidence, every point's in `scores`."""
        probabilities = self.point_probabilities(above)
        at = self._median(probabilities)
        scores = {str(point): round(p, SCORE_DIGITS) for point, p in zip(self.points, probabilities)}  # noqa: B905
        return Prediction(instance_id, schema, self.points[at], probabilities[at], scores)

    @staticmethod
    def _median(probabilities: Sequence[float]) -> int:
        total = 0.0
        for k, p in enumerate(probabilities):
            total += p
            if total >= 0.5:
                return k
        return len(probabilities) - 1

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "points": list(self.points)}


class ContinuousScale:
    """A continuous scheme's bounds and step, and the mean and spread of its train answers."""

    kind = "continuous"

    def __init__(
        self, low: float, high: float, step: float | None, mean: float, spread: float, anchor: float = 0.0
    ) -> None:
        self.low, self.high, self.step, self.mean, self.spread = low, high, step, mean, spread or 1.0
        self.anchor = anchor  # where the step's grid starts: the config's min, else 0 (a step of 5: 0, 5, 10, ...)

    def standard(self, answer: Any) -> float | None:
        """*answer* standardised (None when it is not a number)."""
        number = as_number(answer)
        return None if number is None else (number - self.mean) / self.spread

    def value(self, standardised: float) -> float | int:
        """A standardised output on the scale's units: clipped to its bounds, snapped to its step."""
        number = min(self.high, max(self.low, self.mean + self.spread * float(standardised)))
        if self.step:
            number = self.anchor + round((number - self.anchor) / self.step) * self.step
            while number > self.high:
                number -= self.step
            while number < self.low:
                number += self.step
        return _plain(number)

    def prediction(self, instance_id: str, schema: str, standardised: float) -> Prediction:
        """The value itself, as Potato pre-fills a slider from: a bare number, no confidence."""
        return Prediction(instance_id, schema, self.value(standardised), None, bare=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "min": self.low,
            "max": self.high,
            "step": self.step,
            "mean": self.mean,
            "spread": self.spread,
            "anchor": self.anchor,
        }


Scale = Union[OrdinalScale, ContinuousScale]  # noqa: UP007 - a runtime alias, and the trainers run on 3.8


def scale_from_dict(data: dict[str, Any]) -> Scale:
    """A scale saved with its model (`to_dict`)."""
    if data.get("kind") == ORDINAL:
        return OrdinalScale(data["points"])
    return ContinuousScale(
        float(data["min"]),
        float(data["max"]),
        data.get("step"),
        float(data["mean"]),
        float(data["spread"]),
        float(data.get("anchor") or 0.0),
    )


def scale_for(ctx: RunContext, schema: SchemaSpec) -> Scale:
    """*schema*'s scale: the bundle's scales.json, else what the train answers show."""
    drawn = ctx.bundle.scale(schema.name)
    _, answers = labelled_values(ctx.bundle, "train", schema.name)
    numbers = [n for n in map(as_number, answers) if n is not None]
    if schema.kind == ORDINAL:
        return OrdinalScale(drawn.get("points") or sorted(set(numbers)))
    mean = sum(numbers) / len(numbers) if numbers else 0.0
    spread = math.sqrt(sum((n - mean) ** 2 for n in numbers) / len(numbers)) if numbers else 1.0
    low, high = drawn.get("min"), drawn.get("max")
    return ContinuousScale(
        float(min(numbers, default=0.0) if low is None else low),
        float(max(numbers, default=0.0) if high is None else high),
        drawn.get("step"),
        mean,
        spread,
        float(low or 0.0),
    )


def validate_scale(ctx: RunContext, schema: SchemaSpec, min_train: int = 2) -> list[str]:
    """What stops a trainer of *schema*'s scale: too few answers on it, or all the same."""
    _, answers = labelled_values(ctx.bundle, "train", schema.name)
    scale = scale_for(ctx, schema)
    if isinstance(scale, OrdinalScale):
        if not scale.points:
            return [
                f"Schema '{schema.name}' is an ordinal scale whose points the bundle does not give in order "
                f"(its answers are names, and it has no scales.json); build the bundle with potato-queue"
            ]
        on_scale = [a for a in answers if scale.index(a) is not None]
        off = [a for a in answers if scale.index(a) is None]
        if off:
            ctx.reporter.log(
                "warning",
                f"{len(off)} train answer(s) of {schema.name} are not points of its scale "
                f"({', '.join(map(str, scale.points))}), e.g. {off[0]!r}; left out",
            )
        spread = {scale.index(a) for a in on_scale}
    else:
        on_scale = [a for a in answers if as_number(a) is not None]
        spread = {as_number(a) for a in on_scale}
    if len(on_scale) < min_train:
        return [
            f"Schema '{schema.name}' has {len(on_scale)} train answer(s) on its scale; at least {min_train} are needed"
        ]
    if len(spread) < 2:
        return [f"Schema '{schema.name}' has one answer only ({on_scale[0]}) in the train split; a scale needs two"]
    return []


def validate_scales(ctx: RunContext, min_train: int = 2) -> list[str]:
    """validate_scale of each of the run's scale schemes."""
    return [problem for s in ctx.schemas if s.kind in SCALE_KINDS for problem in validate_scale(ctx, s, min_train)]
