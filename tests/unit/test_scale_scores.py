"""Held-out scores of a scale (a likert, a slider), against sums done by hand (wire/scale_scores.py)."""

from __future__ import annotations

import pytest

from potato_queue.wire.scale_scores import as_number, quadratic_weighted_kappa, spearman
from potato_queue.wire.scoring import score

pytestmark = pytest.mark.unit

GOLD = {"a": 1.0, "b": "2", "c": 3.0, "d": 4.0}  # Potato stores a likert's answer as text or a number
PREDICTED = {"a": 1, "b": 2, "c": 4, "d": 4}


def test_an_ordinal_scheme_is_scored_by_exactness_distance_rank_and_weighted_kappa() -> None:
    # MAE: one item off by one of four = 0.25. Spearman: gold ranks 1,2,3,4; predicted 1,2,3.5,3.5 ->
    # cov 4.5 / sqrt(5 * 4.5) = 0.9487. QWK over points 1..4, weights (i - j)^2: observed disagreement 1
    # (3 predicted 4); chance: the predictions' histogram (1,1,0,2) against the answers' (1,1,1,1), each
    # cell weighted, sum 48 / 4 = 12 -> 1 - 1/12 = 0.9167.
    assert score(GOLD, PREDICTED, "ordinal") == {
        "accuracy": 0.75,
        "macro_f1": 0.6667,
        "n": 4,
        "n_predicted": 4,
        "mae": 0.25,
        "spearman": 0.9487,
        "qwk": 0.9167,
    }


def test_a_continuous_scheme_has_no_exactness_only_distance_and_rank() -> None:
    got = score({"a": 10.0, "b": 20.0, "c": 30.0}, {"a": 12.5, "b": 18.0, "c": 30.0}, "continuous")
    assert got == {"accuracy": None, "macro_f1": None, "n": 3, "n_predicted": 3, "mae": 1.5, "spearman": 1.0}


def test_a_missing_prediction_is_wrong_for_exactness_and_left_out_of_the_distances() -> None:
    got = score(GOLD, {"a": 1, "b": 2, "c": 3}, "ordinal")
    assert (got["accuracy"], got["n"], got["n_predicted"], got["mae"], got["qwk"]) == (0.75, 4, 3, 0.0, 1.0)
    assert score({}, {}, "continuous") == {"accuracy": None, "macro_f1": None, "n": 0}


def test_the_pieces_on_their_edges() -> None:
    assert [as_number(x) for x in ("4", 4, "4.5", "", None, True, "nan", [4])] == [
        4.0,
        4.0,
        4.5,
        None,
        None,
        None,
        None,
        None,
    ]
    assert spearman([1.0, 2.0], [3.0, 3.0]) is None, "a constant side has no rank correlation"
    assert spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert quadratic_weighted_kappa([2, 2], [2, 2]) == 1.0
    assert quadratic_weighted_kappa([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0), "the scale read backwards"
