"""The insight's pure parts (potato_queue/insight/): measures against numbers worked out by hand, the
what-to-label-next ranking, the curve's words, the order written into a data file for Potato."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from potato_queue.insight.measures import (
    Scored,
    confusion,
    mcnemar,
    min_confidence_for,
    per_label,
    reliability,
)
from potato_queue.insight.next_items import (
    LazyVectors,
    cosine,
    document_frequencies,
    rank_next,
    tfidf_vectors,
    uncertainty,
)
from potato_queue.insight.potato_order import (
    POTATO_ORDER_KEYS,
    PRIORITY_FIELD,
    hand_to_potato,
    order_problem,
    write_order,
)
from potato_queue.insight.report import curve_said

pytestmark = pytest.mark.unit


def _items(rows: list[tuple[str, str | None, float | None]]) -> list[Scored]:
    return [Scored(f"i{n}", gold, predicted, conf) for n, (gold, predicted, conf) in enumerate(rows)]


def test_mcnemar_matches_the_hand_computed_exact_and_chi_squared_tests() -> None:
    # A right and B wrong on 3 items, the other way on 9: exact, 2 * P(X <= 3 | n=12, p=1/2)
    # = 2 * (1 + 12 + 66 + 220) / 4096 = 0.14599...
    a = [True] * 3 + [False] * 9 + [True] * 20 + [False] * 5
    b = [False] * 3 + [True] * 9 + [True] * 20 + [False] * 5
    assert mcnemar(a, b) == {"only_a": 3, "only_b": 9, "method": "exact", "statistic": None, "p_value": 0.146}
    # 10 against 25 (35 discordant): (|10 - 25| - 1)^2 / 35 = 5.6, chi-squared(1) tail 0.01796
    a = [True] * 10 + [False] * 25
    b = [False] * 10 + [True] * 25
    got = mcnemar(a, b)
    assert (got["statistic"], got["p_value"], got["method"]) == (5.6, 0.01796, "chi-squared, continuity-corrected")
    assert mcnemar([True, False], [True, False])["p_value"] == 1.0, "no discordant item: no difference"
    even = mcnemar([True] * 15 + [False] * 15, [False] * 15 + [True] * 15)
    assert (even["statistic"], even["p_value"]) == (0.0, 1.0), "as many each way: no difference at all"
    lopsided = mcnemar([False] * 60, [True] * 60)
    assert 0 < lopsided["p_value"] < 1e-10, "a tiny p-value stays readable, not 0.0"
    with pytest.raises(ValueError, match="the same items"):
        mcnemar([True], [True, False])


def test_per_label_and_confusion_count_what_a_reader_would() -> None:
    items = _items([("pos", "pos", 0.9), ("pos", "neg", 0.6), ("neg", "neg", 0.8), ("neg", None, None)])
    rows = {r["label"]: r for r in per_label(items)}
    assert rows["pos"] == {"label": "pos", "precision": 1.0, "recall": 0.5, "f1": 0.6667, "support": 2, "predicted": 1}
    assert rows["neg"] == {"label": "neg", "precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2, "predicted": 2}
    assert confusion(items) == {
        "labels": ["neg", "pos"],
        "columns": ["neg", "pos", "(none)"],
        "counts": [[1, 0, 1], [1, 1, 0]],
    }


def test_reliability_bins_confidence_against_accuracy() -> None:
    items = _items([("a", "a", 0.95), ("a", "b", 0.92), ("a", "a", 0.55), ("a", "a", 1.0), ("a", "a", None)])
    got = reliability(items)
    top = got["bins"][9]
    assert (top["n"], top["accuracy"], top["confidence"]) == (3, 0.6667, 0.9567)
    assert got["bins"][5]["n"] == 1 and got["bins"][5]["accuracy"] == 1.0 and got["bins"][0]["n"] == 0
    assert (got["n"], got["without_confidence"]) == (4, 1)
    assert got["ece"] == round(3 / 4 * abs(2 / 3 - 2.87 / 3) + 1 / 4 * abs(1 - 0.55), 4)


def test_min_confidence_is_the_lowest_that_keeps_the_target_precision() -> None:
    items = _items(
        [("a", "a", 0.99), ("a", "a", 0.9), ("a", "b", 0.8), ("a", "a", 0.7), ("a", "b", 0.6), ("a", "b", 0.5)]
    )
    # kept at >= 0.9: 2 of 2 right; >= 0.7: 3 of 4 (0.75); >= 0.5: 3 of 6
    assert min_confidence_for(items, 0.75) == {
        "target_precision": 0.75,
        "of": 6,
        "min_confidence": 0.7,
        "precision": 0.75,
        "kept": 4,
    }
    assert min_confidence_for(items, 0.9)["min_confidence"] == 0.9
    tied = _items([("a", "a", 0.9), ("a", "b", 0.9), ("a", "a", 0.95)])
    assert min_confidence_for(tied, 0.9)["min_confidence"] == 0.95, "a threshold keeps every item of its confidence"
    assert min_confidence_for(_items([("a", "a", 0.123456), ("a", "b", 0.1)]), 0.9)["min_confidence"] == 0.1234, (
        "rounded down, so Potato's confidence >= min_confidence still keeps the item"
    )
    none = min_confidence_for(_items([("a", "b", 0.9), ("a", "a", 0.4)]), 0.99)
    assert none["min_confidence"] is None and none["best"] == {"min_confidence": 0.4, "precision": 0.5, "kept": 2}


def test_uncertainty_is_the_margin_or_entropy_of_the_scores_else_the_confidence() -> None:
    assert uncertainty({"scores": {"a": 0.5, "b": 0.3, "c": 0.2}}) == 0.8
    assert uncertainty({"scores": {"a": 0.5, "b": 0.5}}, "entropy") == 1.0
    assert uncertainty({"scores": {"a": 1.0, "b": 0.0}}, "entropy") == 0.0
    assert uncertainty({"confidence": 0.75}) == 0.25 and uncertainty({}) == 1.0


def test_the_ranking_puts_the_unsure_first_holds_near_copies_back_and_is_the_same_every_time() -> None:
    texts = {
        "a": "the kettle broke after a week",
        "b": "the kettle broke after one week",
        "c": "lovely soft towels, washed well",
        "d": "shipping was slow but the lamp works",
        "e": "great value, would buy again",
    }
    uncertain = {"a": 0.9, "b": 0.95, "c": 0.5, "d": 0.7, "e": 0.7}
    vectors = tfidf_vectors(texts)
    assert cosine(vectors["a"], vectors["b"]) > 0.6 > cosine(vectors["a"], vectors["d"])
    ranked = rank_next(uncertain, vectors)
    assert [r.instance_id for r in ranked] == ["b", "d", "e", "c", "a"], "ties by id; a near-copy of b goes last"
    assert ranked[-1].near_copy_of == "b" and ranked[0].near_copy_of is None
    assert (
        rank_next(dict(reversed(list(uncertain.items()))), tfidf_vectors(dict(reversed(list(texts.items()))))) == ranked
    )
    windowed = rank_next(uncertain, vectors, window=1)
    assert [r.instance_id for r in windowed] == ["b", "a", "d", "e", "c"], "past the window: uncertainty order only"


def test_the_curve_says_what_the_last_quarter_added_and_what_the_trend_promises() -> None:
    points = [
        {"percent": p, "n_train": n, "test_macro_f1": f}
        for p, n, f in [(25, 50, 0.5), (50, 100, 0.6), (75, 150, 0.66), (100, 200, 0.70)]
    ]
    said = curve_said(points, "test")
    assert said.startswith("the last 25 % of the train items (50) added 0.04 test macro-F1 (0.66 to 0.70)")
    assert "another 50 labelled items would add about 0.03" in said
    assert curve_said(points[:1], "test") == "not enough points to say"
    # A slider has no classes: its curve is read by MAE, which falls as the model gets better.
    slider = [{"percent": p, "n_train": n, "test_mae": m} for p, n, m in [(50, 100, 9.0), (100, 200, 7.5)]]
    said = curve_said(slider, "test")
    assert said.startswith("the last 50 % of the train items (100) lowered the test MAE by 1.50 (9.00 to 7.50)")
    assert "another 50 labelled items would lower it by about 0.48" in said, said


def test_the_order_goes_into_the_data_files_and_nothing_else_changes(tmp_path: Path) -> None:
    from potato_queue.config import build_config

    array = tmp_path / "items.json"
    array.write_text(
        json.dumps([{"id": "a", "text": "x"}, {"id": "b", "text": "y", PRIORITY_FIELD: 9}], indent=1) + "\n"
    )
    lines = tmp_path / "more.jsonl"
    lines.write_text('{"id":"c",  "text":"kept as it was"}\n{"id": "d", "text": "z"}\n')
    array.chmod(0o644)
    config = build_config(
        {
            "data_files": [array.name, lines.name],
            "item_properties": {"id_key": "id", "text_key": "text"},
            "annotation_schemes": [],
        },
        tmp_path / "config.yaml",
    )
    assert "assignment_strategy: priority" in (order_problem(config) or "")
    got = write_order(config, ["d", "a"])
    assert got == {"files": [str(array), str(lines)], "items": 3, "ranked": 2}
    assert json.loads(array.read_text()) == [{"id": "a", "text": "x", PRIORITY_FIELD: 1}, {"id": "b", "text": "y"}]
    assert array.read_text().startswith('[\n {\n  "id"'), "the file's indent is kept"
    assert oct(array.stat().st_mode & 0o777) == "0o644", "and its mode"
    assert (
        lines.read_text()
        == '{"id":"c",  "text":"kept as it was"}\n{"id": "d", "text": "z", "' + PRIORITY_FIELD + '": 2}\n'
    )
    assert write_order(config, ["d", "a"])["files"] == [], "the same order again changes nothing"
    keys = {
        "data_files": [],
        "assignment_strategy": "priority",
        "triage": {"enabled": True, "signal_field": PRIORITY_FIELD},
    }
    assert order_problem(build_config(keys, tmp_path / "config.yaml")) is None
    for triage, why in (
        ({"rules": [{"name": "x"}]}, "triage.rules come before signal_field"),
        ({"invert_signal": True}, "invert_signal turns the order round"),
        ({"default_priority": 5}, "default_priority puts unranked items level"),
    ):
        problem = order_problem(
            build_config({**keys, "triage": {**keys["triage"], **triage}}, tmp_path / "config.yaml")
        )
        assert problem and why in problem, problem


def test_a_linked_data_file_is_written_where_it_points_and_an_unreadable_one_is_refused(tmp_path: Path) -> None:
    from potato_queue.config import build_config
    from potato_queue.errors import Conflict

    (tmp_path / "shared").mkdir()
    target = tmp_path / "shared" / "items.jsonl"
    target.write_text('{"id": "a"}\n')
    (tmp_path / "items.jsonl").symlink_to(target)
    config = build_config(
        {"data_files": ["items.jsonl"], "item_properties": {"id_key": "id"}}, tmp_path / "config.yaml"
    )
    write_order(config, ["a"])
    assert (tmp_path / "items.jsonl").is_symlink() and json.loads(target.read_text())[PRIORITY_FIELD] == 1
    target.write_bytes(b"\xff\xfe not text")
    with pytest.raises(Conflict, match="cannot be read"):
        write_order(config, ["a"])


def test_an_order_potatos_config_would_not_serve_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    from potato_queue.config import build_config
    from potato_queue.errors import Conflict
    from potato_queue.store.keys import staging_dir

    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "a"}\n{"id": "b"}\n')
    config = build_config({"data_files": [items.name], "item_properties": {"id_key": "id"}}, tmp_path / "config.yaml")
    with pytest.raises(Conflict) as refused:
        hand_to_potato(config, ["b", "a"])
    assert str(refused.value).startswith(
        "The order was not written into the data files: Potato serves this order only with these keys in "
    )
    assert "now assignment_strategy is not priority; triage is not enabled" in str(refused.value)
    assert refused.value.fix == "add those keys to Potato's config, then send the order again"
    assert items.read_text() == '{"id": "a"}\n{"id": "b"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["items.jsonl"], "no temp file, no staging folder"
    ready = build_config(
        {**config.model_dump(), **POTATO_ORDER_KEYS, "data_files": [items.name]}, tmp_path / "config.yaml"
    )
    assert hand_to_potato(ready, ["b", "a"])["items"] == 2
    assert staging_dir(ready).is_dir(), "the temp file was staged in potato-queue's folder"
    assert [p.name for p in items.parent.iterdir() if p.name.startswith(".")] == []


def test_an_id_with_a_newline_after_it_is_no_run_id_gpu_list_or_model_name() -> None:
    """A regular expression's `$` matches before a last newline: each check takes the whole text."""
    from potato_queue.errors import Invalid
    from potato_queue.runs.model_card import base_model
    from potato_queue.runs.publish import check_repo_id
    from potato_queue.store.keys import RUN_ID_RE

    assert RUN_ID_RE.fullmatch("20261204T174537-02b502")
    assert not RUN_ID_RE.fullmatch("20261204T174537-02b502\n")
    with pytest.raises(Invalid):
        check_repo_id("my-lab/reviews\n")
    check_repo_id("my-lab/reviews")
    assert base_model({"model_name": "bert-base-uncased"})[0] == "bert-base-uncased"
    assert base_model({"model_name": "bert-base-uncased\n"})[0] is None


def test_the_first_n_of_what_to_label_next_are_the_first_n_of_the_whole_order() -> None:
    """With a limit the ranking stops once it has them (the first 20 of 100,000 items look at a few dozen
    texts); they are the whole order's first, near-copies held back alike."""
    rng = random.Random(5)
    words = ["plot", "cast", "score", "ending", "pace", "music", "camera", "dialogue", "twist", "villain"]
    texts = {f"t{n:03d}": " ".join(rng.sample(words, 3)) for n in range(300)}
    uncertain = {key: round(rng.random(), 2) for key in texts}
    whole = rank_next(uncertain, tfidf_vectors(texts))
    assert any(r.near_copy_of for r in whole[:60]), "the case has near-copies near the top"
    documents = document_frequencies(texts.values())
    for limit in (1, 5, 20, 60, 299, 300, 400):
        assert rank_next(uncertain, LazyVectors(texts, documents, len(texts)), limit=limit) == whole[:limit], limit
