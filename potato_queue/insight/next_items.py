"""What to label next: the unlabelled items ranked by the run's uncertainty, near-copies held back.

Uncertainty is read from the run's own predictions: the margin between the two most probable labels
(1 - (p1 - p2)) when the prediction has every label's score, else 1 - confidence; for several schemas,
the mean over them. A multiselect's prediction (its payload a list: one probability a label, each its
own yes-or-no) is as unsure as its labels on average: the margin of a label is between its yes and its
no (1 - |2p - 1|), its entropy the binary one (in bits, so 1 at p = 0.5). A likert's (kind ordinal: its
scores every point's probability, in the scale's order) is as unsure as its spread: the expected distance
of the answer from the predicted point, over half the scale's length (0 when sure, 1 when split between
both ends); a prediction two points off matters more than one a point off, which a margin cannot tell.
A slider's carries no probability, so it is 1 for every item and ranks nothing. Diversity: the items are taken
most uncertain first, and one whose TF-IDF cosine to an item already taken is at least NEAR_DUPLICATE_COSINE waits until the end (in its order), so the top
of the list is never ten near-copies of one review. TF-IDF, not the model's embeddings: it needs no
model on the server and no new file from the training machine, and says the same for every trainer.
Ties go by instance id, so the ranking of a run is the same every time it is asked.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NEAR_DUPLICATE_COSINE",
    "DIVERSITY_WINDOW",
    "MEASURES",
    "uncertainty",
    "mean_uncertainty",
    "tfidf_vectors",
    "document_frequencies",
    "tfidf_vector",
    "LazyVectors",
    "cosine",
    "Ranked",
    "rank_next",
]

NEAR_DUPLICATE_COSINE = 0.6
DIVERSITY_WINDOW = 1000  # the most uncertain items checked for near-copies: 500,000 cosines at most
MEASURES = ("margin", "entropy")
_WORD = re.compile(r"\w+", re.UNICODE)
Vector = dict[str, float]


def _scores(prediction: Mapping[str, Any]) -> list[float]:
    scores = prediction.get("scores")
    if not isinstance(scores, dict):
        return []
    return sorted(
        (float(v) for v in scores.values() if isinstance(v, (int, float)) and not isinstance(v, bool)), reverse=True
    )


def _label_uncertainty(p: float, measure: str) -> float:
    """One label's yes-or-no, from 0 (sure) to 1 (p = 0.5)."""
    if measure == "entropy":
        return -sum(q * math.log2(q) for q in (p, 1.0 - p) if q > 0)
    return 1.0 - abs(2.0 * p - 1.0)


def _spread(prediction: Mapping[str, Any]) -> float | None:
    """A likert prediction's expected distance from its point over half the scale (None: not one)."""
    scores = prediction.get("scores")
    payload = prediction.get("payload")
    if not isinstance(scores, dict) or len(scores) < 2 or not isinstance(payload, dict):
        return None
    points = list(scores)
    at = points.index(str(payload.get("label"))) if str(payload.get("label")) in points else None
    if at is None:
        return None
    total = sum(float(v) for v in scores.values()) or 1.0
    expected = sum(float(v) / total * abs(k - at) for k, v in enumerate(scores.values()))
    return round(min(1.0, expected / ((len(points) - 1) / 2.0)), 4)


def uncertainty(prediction: Mapping[str, Any], measure: str = "margin", kind: str = "nominal") -> float:
    """How unsure the run was of one prediction, from 0 (sure) to 1: margin or normalised entropy of its
    scores; 1 - confidence without them; 1 with neither. A multiselect's: its labels' mean; a likert's
    (kind ordinal) margin: its spread."""
    spread = _spread(prediction) if kind == "ordinal" and measure == "margin" else None
    if spread is not None:
        return spread
    values = _scores(prediction)
    if values and isinstance(prediction.get("payload"), list):
        return round(sum(_label_uncertainty(min(1.0, max(0.0, p)), measure) for p in values) / len(values), 4)
    if len(values) >= 2:
        if measure == "entropy":
            total = sum(values) or 1.0
            entropy = -sum(p / total * math.log(p / total) for p in values if p > 0)
            return round(entropy / math.log(len(values)), 4)
        return round(1.0 - (values[0] - values[1]), 4)
    confidence = prediction.get("confidence")
    if isinstance(confidence, (int, float)) and not isinstance(confidence, bool):
        return round(1.0 - float(confidence), 4)
    return 1.0


def _words(text: str) -> Counter[str]:
    return Counter(_WORD.findall(text.lower()))


def document_frequencies(texts: Iterable[str]) -> Counter[str]:
    """In how many of the texts each word is: the idf's counts, worked out once (a run's finalize keeps them)."""
    return Counter(word for text in texts for word in _words(text))


def tfidf_vector(text: str, documents: Mapping[str, int], n: int) -> Vector:
    """One text's unit-length TF-IDF vector (lower-cased words, smoothed idf over `n` documents)."""
    weights = {w: c * (math.log((1 + n) / (1 + documents.get(w, 0))) + 1) for w, c in _words(text).items()}
    norm = math.sqrt(sum(v * v for v in weights.values())) or 1.0
    return {w: v / norm for w, v in weights.items()}


def tfidf_vectors(texts: Mapping[str, str]) -> dict[str, Vector]:
    """Unit-length TF-IDF vectors of each text, over these texts."""
    documents = document_frequencies(texts.values())
    return {key: tfidf_vector(text, documents, len(texts)) for key, text in texts.items()}


class LazyVectors(Mapping[str, Vector]):
    """TF-IDF vectors worked out when asked for, with frequencies counted before: "what to label next" for the
    first 20 items of 100,000 looks at a few dozen texts, not all of them."""

    def __init__(self, texts: Mapping[str, str], documents: Mapping[str, int], n: int) -> None:
        self.texts, self.documents, self.n = texts, documents, n
        self._made: dict[str, Vector] = {}

    def __getitem__(self, key: str) -> Vector:
        if key not in self._made:
            self._made[key] = tfidf_vector(self.texts[key], self.documents, self.n)
        return self._made[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.texts)

    def __len__(self) -> int:
        return len(self.texts)


def cosine(a: Vector, b: Vector) -> float:
    if len(a) > len(b):
        a, b = b, a
    return sum(v * b.get(w, 0.0) for w, v in a.items())


@dataclass(frozen=True)
class Ranked:
    instance_id: str
    uncertainty: float
    near_copy_of: str | None  # the item above it that it nearly repeats (it was held back), or None


def rank_next(
    uncertain: Mapping[str, float],
    vectors: Mapping[str, Vector],
    near_duplicate: float = NEAR_DUPLICATE_COSINE,
    window: int = DIVERSITY_WINDOW,
    limit: int | None = None,
) -> list[Ranked]:
    """Every item of `uncertain` ({id: uncertainty}), most uncertain first, near-copies of an item taken
    before held back to the end; with `limit`, the first `limit` of that order only. Only the `window` most
    uncertain are checked for near-copies (a bounded number of cosines, however many items: nobody labels
    past the window before the next run), the rest follow in their order."""
    order = sorted(uncertain, key=lambda i: (-uncertain[i], i))
    taken: list[Ranked] = []
    held: list[Ranked] = []
    for iid in order[:window]:
        vector = vectors.get(iid, {})
        copy_of = next(
            (t.instance_id for t in taken if cosine(vector, vectors.get(t.instance_id, {})) >= near_duplicate), None
        )
        (held if copy_of else taken).append(Ranked(iid, uncertain[iid], copy_of))
        if limit is not None and len(taken) >= limit:
            return taken[:limit]  # what follows cannot come before these
    ranked = taken + held + [Ranked(iid, uncertain[iid], None) for iid in order[window:]]
    return ranked if limit is None else ranked[:limit]


def mean_uncertainty(
    predictions: Sequence[Mapping[str, Any]], measure: str, kinds: Mapping[str, str] | None = None
) -> dict[str, float]:
    """{instance id: its predictions' mean uncertainty over the schemas}; *kinds*: {schema: kind}."""
    found: dict[str, list[float]] = {}
    for p in predictions:
        kind = (kinds or {}).get(str(p.get("schema_name")), "nominal")
        found.setdefault(str(p["instance_id"]), []).append(uncertainty(p, measure, kind))
    return {iid: round(sum(values) / len(values), 4) for iid, values in found.items()}
