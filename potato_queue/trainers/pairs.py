"""A pairwise scheme's two texts for a bag-of-words model: features of A minus features of B.

A bag of words over "A: ... B: ..." cannot tell which side a word is on, so it cannot learn a preference.
sklearn-text instead reads each pair (the bundle row's `pair`) as one string joined by PAIR_SEPARATOR and
turns it into the difference of the two texts' TF-IDF vectors, and that difference's size (what a tie
looks like): a linear model over them is a Bradley-Terry-style reward model, score(A) - score(B).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PAIR_SEPARATOR", "PairFeatures", "is_pairwise", "model_input"]

PAIR_SEPARATOR = "\x1f"  # ASCII's unit separator: in no text a person writes


def is_pairwise(schema: Any) -> bool:
    """Whether a scheme compares two texts (Potato's pairwise type, binary or scale)."""
    return str(getattr(schema, "annotation_type", "") or "").strip().lower() == "pairwise"


def model_input(row: dict[str, Any], paired: bool) -> str:
    """What sklearn-text reads of a bundle row: its text, or its pair joined by PAIR_SEPARATOR."""
    pair = row.get("pair") if paired else None
    if isinstance(pair, list) and len(pair) >= 2:
        return f"{pair[0]}{PAIR_SEPARATOR}{pair[1]}"
    return str(row.get("text") or "")


class PairFeatures:
    """A text vectorizer over both texts of each pair; transform gives [A - B, |A - B|]. Pickled in model.pkl."""

    def __init__(self, vectorizer: Any) -> None:
        self.vectorizer = vectorizer

    @staticmethod
    def _split(inputs: list[str]) -> tuple[list[str], list[str]]:
        firsts, seconds = [], []
        for text in inputs:
            first, _, second = str(text).partition(PAIR_SEPARATOR)
            firsts.append(first)
            seconds.append(second)
        return firsts, seconds

    def fit(self, inputs: list[str], _y: Any = None) -> PairFeatures:
        firsts, seconds = self._split(list(inputs))
        self.vectorizer.fit(firsts + seconds)
        return self

    def transform(self, inputs: list[str]) -> Any:
        from scipy.sparse import hstack

        firsts, seconds = self._split(list(inputs))
        difference = self.vectorizer.transform(firsts) - self.vectorizer.transform(seconds)
        return hstack([difference, abs(difference)]).tocsr()

    def fit_transform(self, inputs: list[str], y: Any = None) -> Any:
        return self.fit(inputs, y).transform(inputs)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {"vectorizer": self.vectorizer}

    def set_params(self, **params: Any) -> PairFeatures:
        self.vectorizer = params.get("vectorizer", self.vectorizer)
        return self
