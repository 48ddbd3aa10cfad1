"""The model against the annotators (insight/agreement.py): the human-human figures are Potato's own
definitions (the functions behind its /admin/iaa, called here), a hand computation of the model-human ones,
and the sentence that says whether the model sits inside the annotators' disagreement."""

from __future__ import annotations

import math
import random
import warnings
from typing import Any

import pytest

from potato_queue.insight.agreement import (
    MODEL,
    alpha_nominal,
    mean_kappa,
    pairwise_agreement,
    schema_agreement,
    verdict,
)

pytestmark = pytest.mark.unit


def crowd(seed: int, n_items: int = 60) -> list[dict[str, Any]]:
    """Three annotators of mixed care on overlapping shares of the items."""
    rng = random.Random(seed)
    items = []
    for _ in range(n_items):
        truth = rng.choice("abc")
        labels = {}
        for name, care, cover in (("alice", 0.9, 0.9), ("bob", 0.7, 0.8), ("carol", 0.5, 0.6)):
            if rng.random() < cover:
                labels[name] = truth if rng.random() < care else rng.choice("abc")
        items.append(labels)
    return items


def same(ours: float | None, potatos: float) -> bool:
    return (ours is None and math.isnan(potatos)) or (ours is not None and math.isclose(ours, potatos, abs_tol=1e-9))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_human_human_figures_are_potatos_own(seed: int) -> None:
    from potato.server_utils.iaa import alpha, nominal

    items = crowd(seed)
    assert same(mean_kappa(items), nominal.mean_cohen_kappa_over_shared_items(items))
    assert same(pairwise_agreement(items), nominal.mean_pairwise_agreement(items))
    long_format = [(rater, str(n), label) for n, labels in enumerate(items) for rater, label in labels.items()]
    with warnings.catch_warnings():  # simpledorff's pandas call warns of pandas 4 (the suite makes warnings errors)
        warnings.simplefilter("ignore")
        potatos = alpha.krippendorff_alpha(long_format, "nominal")
    assert same(alpha_nominal(items), potatos)


def test_model_human_figures_by_hand() -> None:
    """Four items, two annotators who agree on three; the model agrees with alice on all and with bob on two."""
    items = [
        {"alice": "pos", "bob": "pos", MODEL: "pos"},
        {"alice": "neg", "bob": "neg", MODEL: "neg"},
        {"alice": "pos", "bob": "neg", MODEL: "pos"},
        {"alice": "neg", "bob": "neg", MODEL: "pos"},
    ]
    found = schema_agreement(items)
    assert (found["items"], found["annotators"]) == (4, 2)
    # alice vs bob: agree 3/4; p_e = (2*1 + 2*3)/16 = 0.5; kappa = (0.75 - 0.5) / 0.5 = 0.5
    assert found["human_human"]["kappa"] == 0.5
    assert found["human_human"]["percent_agreement"] == 0.75
    # model vs alice: 3/4, p_e = (3*2 + 1*2)/16 = 0.5 -> 0.5; model vs bob: 2/4, p_e = (3*1 + 1*3)/16 -> 0.2
    assert found["model_human"]["kappa"] == round((0.5 + 0.2) / 2, 4)
    assert found["model_human"]["percent_agreement"] == round((3 / 4 + 2 / 4) / 2, 4)
    for side in ("human_human", "model_human"):
        low, high = found[side]["kappa_interval"] or [None, None]
        assert low is not None and low <= found[side]["kappa"] <= high


def test_the_verdict_says_inside_or_outside_the_annotators_disagreement() -> None:
    inside = {"items": 40, "human_human": {"kappa": 0.6, "kappa_interval": [0.5, 0.7]}, "model_human": {"kappa": 0.55}}
    assert verdict(inside).startswith("inside the annotators' own disagreement: ")
    below = {**inside, "model_human": {"kappa": 0.3}}
    assert verdict(below).startswith("outside the annotators' own disagreement: the model agrees with them less")
    above = {**inside, "model_human": {"kappa": 0.9}}
    assert verdict(above).startswith("the model agrees with the annotators more than they agree with each other")
    assert "model-human kappa 0.30 against human-human 0.60 (0.50 to 0.70)" in verdict(below)
    assert verdict({"items": 0, "human_human": None, "model_human": None}).startswith("too few held-out items")


def test_items_without_two_annotators_and_the_model_are_left_out() -> None:
    items = [{"alice": "a", MODEL: "a"}, {"alice": "a", "bob": "b"}, {"alice": "a", "bob": "a", MODEL: "a"}]
    assert schema_agreement(items)["items"] == 1
