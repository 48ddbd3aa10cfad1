"""Scales: a likert (ordinal; numeric, and labelled with names) and a slider (continuous), trained for real.

The codings are checked against sums done by hand; the trainers run through the queue (a real server,
Redis, executor and agent on the local backend, and the ssh backend against a real sshd) on the small
reviews project with three scale schemes answered as Potato 2.12.1 stores them; the prelabels are read
back from the real Potato 2.12.1's annotation page.
"""

from __future__ import annotations

import json
import re
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import yaml

from potato_queue.bundle import build_bundle
from potato_queue.bundle.read import scheme_scale
from potato_queue.runs.gate import potato_cannot_show
from potato_queue.trainers.scales import ContinuousScale, OrdinalScale
from potato_queue.validate import load_checked
from potato_queue.wire.scoring import score
from tests.e2e.server.test_page import browser, signed_in  # noqa: F401, F811 - browser: the fixture, one chromium for the module
from tests.e2e.ssh.test_ssh_backend import BACKEND, gpu_server
from tests.lifecycle_helpers import ADMIN_KEY, TERMINAL, Services, make_project, run_paths, started
from tests.potato_helpers import PotatoAnnotator, PotatoServer, add_potato_keys
from tests.sshd import Sshd

VERDICTS = ["Hated it", "Disliked it", "Mixed", "Liked it", "Loved it"]
# How many stars a review of the small project gives, by its closing sentence.
STARS = {
    "I left halfway through.": 1,
    "Not worth the ticket.": 2,
    "Skip this one.": 2,
    "Far too long.": 3,
    "I checked my phone a lot.": 3,
    "Highly recommended.": 4,
    "Worth every minute.": 4,
    "I would watch it again.": 4,
    "A joy from start to finish.": 5,
    "It stayed with me for days.": 5,
}
SCHEMES = [
    {
        "annotation_type": "likert",
        "name": "stars",
        "description": "Stars",
        "size": 5,
        "min_label": "bad",
        "max_label": "great",
    },
    {"annotation_type": "likert", "name": "verdict", "description": "Verdict", "labels": VERDICTS},
    {
        "annotation_type": "slider",
        "name": "score",
        "description": "Score",
        "min_value": 0,
        "max_value": 100,
        "step": 5,
        "starting_value": 50,
    },
]


@pytest.mark.unit
def test_an_ordinal_scale_is_coded_as_above_each_point_and_read_back_as_its_median() -> None:
    scale = OrdinalScale([1, 2, 3, 4])
    assert scale.outputs == ["above 1", "above 2", "above 3"]
    assert (scale.target(3.0), scale.target("1"), scale.target(7)) == ([1.0, 1.0, 0.0], [0.0, 0.0, 0.0], None)
    # P(above) 0.9, 0.6, 0.2: points 0.1, 0.3, 0.4, 0.2; the running total passes 0.5 at point 3.
    prediction = scale.prediction("i", "stars", [0.9, 0.6, 0.2])
    assert (prediction.label, round(prediction.confidence or 0, 6)) == (3, 0.4)
    assert prediction.scores == {"1": 0.1, "2": 0.3, "3": 0.4, "4": 0.2}
    # An answer that is not monotone (above 2 less likely than above 3) is made so: above 3 is capped at 0.3.
    assert [round(p, 6) for p in scale.point_probabilities([0.8, 0.3, 0.6])] == [0.2, 0.5, 0.0, 0.3]
    labelled = OrdinalScale(VERDICTS)
    assert labelled.target("Liked it") == [1.0, 1.0, 1.0, 0.0] and labelled.target(4) is None
    assert labelled.prediction("i", "verdict", [0.99, 0.9, 0.8, 0.1]).label == "Liked it"


@pytest.mark.unit
def test_a_continuous_scale_puts_a_prediction_back_on_its_units_bounds_and_step() -> None:
    scale = ContinuousScale(0, 100, 5, mean=50.0, spread=20.0)
    assert scale.standard("70") == 1.0 and scale.standard("n/a") is None
    assert [scale.value(z) for z in (0.61, -9.0, 9.0)] == [60, 0, 100], "62.2 snaps to 60; clipped at both ends"
    # Without a min in the config the bounds are the answers' (3 to 98), and the step's grid still starts at 0.
    assert [ContinuousScale(3, 98, 5, mean=50.0, spread=20.0).value(z) for z in (0.0, -9.0, 9.0)] == [50, 5, 95]
    prediction = scale.prediction("i", "score", 0.61)
    # Potato pre-fills a slider from a bare number only: a {label, confidence} dict would set its midpoint.
    assert prediction.to_record() == {"instance_id": "i", "schema_name": "score", "payload": 60, "confidence": None}


@pytest.mark.unit
def test_the_scale_comes_from_the_config_and_a_labelled_likert_is_scored_by_its_points_order() -> None:
    stars, verdict, slider = SCHEMES
    assert scheme_scale(stars) == {"points": [1, 2, 3, 4, 5]}
    assert scheme_scale(verdict) == {"points": VERDICTS}
    assert scheme_scale(slider) == {"min": 0, "max": 100, "step": 5}
    gold = {"a": "Loved it", "b": "Mixed", "c": "Hated it"}
    predicted = {"a": "Liked it", "b": "Mixed", "c": "Disliked it"}
    scores = score(gold, predicted, "ordinal", VERDICTS)
    # Positions 5, 3, 1 against 4, 3, 2: one exact, MAE (1 + 0 + 1) / 3.
    assert (scores["accuracy"], scores["mae"], scores["spearman"], scores["n"]) == (0.3333, 0.6667, 1.0, 3)
    # Potato 2.12.1 pre-fills a likert only through its labels, and never a number field or a select.
    assert potato_cannot_show(stars) and potato_cannot_show({"annotation_type": "number"})
    assert potato_cannot_show(verdict) is None and potato_cannot_show(slider) is None


def test_the_bundle_carries_each_scales_answers_and_points(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    _add_scales(config)
    manifest = build_bundle(load_checked(config), tmp_path / "bundle")
    assert [(s["name"], s["kind"], s["labels"]) for s in manifest["schemas"][1:]] == [
        ("stars", "ordinal", []),
        ("verdict", "ordinal", []),
        ("score", "continuous", []),
    ], "Potato's manifest"
    assert json.loads((tmp_path / "bundle" / "scales.json").read_text()) == {
        "stars": {"points": [1, 2, 3, 4, 5]},
        "verdict": {"points": VERDICTS},
        "score": {"min": 0, "max": 100, "step": 5},
    }
    row = json.loads((tmp_path / "bundle" / "train.jsonl").read_text().splitlines()[0])
    assert isinstance(row["targets"]["stars"], float) and row["targets"]["verdict"] in VERDICTS
    assert row["targets"]["score"] == 20.0 * row["targets"]["stars"] - 10


def test_sklearn_text_trains_the_three_scales_through_the_queue(
    tmp_path: Path,
    redis_server_url: str,
    browser: Any,  # noqa: F811 - the fixture
) -> None:
    writeback = {"schemas": ["stars", "verdict", "score"], "include_unlabeled": True, "min_confidence": 0.0}
    with scales_stack(tmp_path, redis_server_url, writeback=writeback) as svc:
        run_id = svc.start_run(trainer="sklearn-text", schemas=["stars", "verdict", "score"])
        run = svc.wait_for(run_id, TERMINAL, 120)
        log = run_paths(svc, run_id).run_log.read_text()
        assert run["state"] == "succeeded", (run, log)
        held = run["held_out"]
        assert set(held["stars"]["test"]) == {"accuracy", "macro_f1", "mae", "spearman", "qwk", "n", "n_predicted"}
        assert held["stars"]["test"]["mae"] <= 0.5 and held["verdict"]["test"]["qwk"] >= 0.8, held
        assert held["score"]["test"]["accuracy"] is None and held["score"]["test"]["mae"] <= 15, held["score"]
        lines = [json.loads(x) for x in run_paths(svc, run_id).predictions.read_text().splitlines()]
        by_schema: dict[str, list[dict[str, Any]]] = {}
        for p in lines:
            by_schema.setdefault(p["schema_name"], []).append(p)
        assert all(p["payload"]["label"] in (1, 2, 3, 4, 5) for p in by_schema["stars"]), "the scale's own values"
        assert all(set(p["scores"]) == {"1", "2", "3", "4", "5"} for p in by_schema["stars"])
        assert all(p["payload"]["label"] in VERDICTS for p in by_schema["verdict"])
        assert all(
            isinstance(p["payload"], (int, float)) and p["payload"] % 5 == 0 and 0 <= p["payload"] <= 100
            for p in by_schema["score"]
        ), "a bare number on the slider's step"
        assert "stars's predictions are stored, not published: Potato 2.12.1 pre-fills no likert without labels" in log
        published = [
            json.loads(x)
            for x in (svc.config.parent / "annotation_output" / "training" / "predictions.jsonl")
            .read_text()
            .splitlines()
        ]
        assert {p["schema_name"] for p in published if p["run_id"] == run_id} == {"verdict", "score"}, "stars kept off"
        for route in ("quality", "next"):  # the insight pages read a run of scales without failing
            status, body = svc.api("GET", f"/runs/{run_id}/{route}")
            assert status == 200, (route, body)
        page = signed_in(browser, svc)  # the run's page names each kind's measures
        page.goto(f"{svc.url}/admin/training/runs/{run_id}")
        page.wait_for_selector("#predictions table", timeout=30000)
        shown = page.text_content("body") or ""
        assert re.search(r"stars: \d\.\d{3} / \d\.\d{3}, MAE \d\.\d{3}, QWK", shown), shown[:3000]
        assert re.search(r"score: MAE \d+\.\d{3}, Spearman", shown), shown[:3000]
        page.close()
        weaker = svc.start_run(
            trainer="sklearn-text", schemas=["stars", "score"], params={"C": 0.01, "learning_curve": True}
        )
        assert svc.wait_for(weaker, TERMINAL, 120)["state"] == "succeeded"
        status, curve = svc.api("GET", f"/runs/{weaker}/curve")
        assert status == 200, curve
        assert [p["percent"] for p in curve["schemas"]["score"]["points"]] == [25, 50, 75, 100]
        assert "test MAE by" in curve["schemas"]["score"]["said"], "a slider's curve is read by its MAE"
        assert "test macro-F1" in curve["schemas"]["stars"]["said"]
        status, compared = svc.api("GET", f"/runs/{run_id}/compare/{weaker}")
        assert status == 200, compared
        stars = compared["schemas"]["stars"]
        assert stars["n"] > 0 and {"mae", "spearman", "qwk"} <= set(stars["a"]), stars["a"]
        assert stars["a"]["accuracy"] > 0.5, "a likert's answer 4.0 and its predicted point 4 agree"


def test_hf_text_classification_fine_tunes_a_likert_and_a_slider(
    tmp_path: Path, redis_server_url: str, tiny_model: Path
) -> None:
    """A real fine-tune (a tiny BERT built here, on the CPU): a head of "above point k" sigmoids for the likert,
    a regression for the slider; both beat answering every item with the train answers' middle."""
    with scales_stack(tmp_path, redis_server_url) as svc:
        run_id = svc.start_run(
            trainer="hf-text-classification",
            schemas=["stars", "score"],
            params={
                "model_name": str(tiny_model),
                "epochs": 25,
                "batch_size": 8,
                "max_length": 16,
                "learning_rate": 5e-3,
            },
        )
        run = svc.wait_for(run_id, TERMINAL, 240)
        assert run["state"] == "succeeded", (run, run_paths(svc, run_id).run_log.read_text())
        saved = run_paths(svc, run_id).artifacts
        assert json.loads((saved / "stars" / "config.json").read_text())["problem_type"] == "multi_label_classification"
        assert json.loads((saved / "score" / "config.json").read_text())["problem_type"] == "regression"
        assert json.loads((saved / "stars" / "scale.json").read_text())["points"] == [1, 2, 3, 4, 5]
        baseline = _middle_answer_mae(svc, run_id)
        for schema in ("stars", "score"):
            test = run["held_out"][schema]["test"]
            assert test["mae"] < baseline[schema], (schema, test, baseline)


def _middle_answer_mae(svc: Services, run_id: str) -> dict[str, float]:
    """The test MAE of answering every item with the train answers' median: what a model must beat."""
    bundle = run_paths(svc, run_id).bundle_dir
    rows = {
        split: [json.loads(x)["targets"] for x in (bundle / f"{split}.jsonl").read_text().splitlines()]
        for split in ("train", "test")
    }
    out = {}
    for schema in ("stars", "score"):
        train = sorted(t[schema] for t in rows["train"] if schema in t)
        middle = train[len(train) // 2]
        test = [t[schema] for t in rows["test"] if schema in t]
        out[schema] = sum(abs(x - middle) for x in test) / len(test)
    return out


def test_a_likert_trains_on_the_ssh_backend_too(tmp_path: Path, redis_server_url: str, sshd: Sshd) -> None:
    """A remote backend (a real sshd on 127.0.0.1): the scale file and the scale's scores cross the agent."""
    sshd.write_config("root")
    with scales_stack(
        tmp_path,
        redis_server_url,
        {"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)},
        **gpu_server(tmp_path, python=sys.executable),
    ) as svc:  # a Python with sklearn
        run_id = svc.start_run(trainer="sklearn-text", schemas=["verdict", "score"], backend=BACKEND)
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "succeeded" and run["ran_on"] == BACKEND, (run, svc.logs())
        assert run["held_out"]["verdict"]["test"]["qwk"] >= 0.8, run["held_out"]
        lines = [json.loads(x) for x in run_paths(svc, run_id).predictions.read_text().splitlines()]
        assert {p["payload"]["label"] for p in lines if p["schema_name"] == "verdict"} <= set(VERDICTS)


def test_potato_pre_fills_a_labelled_likert_and_a_slider_from_the_run(tmp_path: Path, redis_server_url: str) -> None:
    """Potato 2.12.1 itself: the likert's predicted label comes checked, the slider set to the predicted value."""
    config = make_project(
        tmp_path,
        grace_seconds=2,
        writeback={"schemas": ["verdict", "score"], "include_unlabeled": True, "min_confidence": 0.0},
    )
    add_potato_keys(config)
    _add_scales(config)
    potato, svc = PotatoServer(config, tmp_path, ADMIN_KEY), Services(config, redis_server_url, tmp_path)
    try:
        svc.serve()
        svc.executor()
        run_id = svc.start_run(trainer="sklearn-text", schemas=["verdict", "score"])
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "succeeded", (run, svc.logs())
        potato.start()  # it publishes the run's prelabels as it starts
        page = potato.first_page_of("erin")
        served = PotatoAnnotator.ITEM.search(page)
        assert served, page[-3000:]
        lines = [json.loads(x) for x in run_paths(svc, run_id).predictions.read_text().splitlines()]
        predicted = {p["schema_name"]: p["payload"] for p in lines if p["instance_id"] == served.group(1)}
        checked = re.findall(r'<input checked="True"[^>]*value="([^"]+)"', page)
        assert checked == [predicted["verdict"]["label"]], (checked, predicted)
        slider = re.search(r'<input[^>]*name="score:::slider"[^>]*>', page)
        assert slider and f'value="{predicted["score"]}"' in slider.group(0), (slider, predicted)
    finally:
        svc.stop()
        potato.stop()


def scales_stack(
    tmp_path: Path, redis_url: str, executor_env: dict[str, str] | None = None, **training: Any
) -> AbstractContextManager[Services]:
    """The small project with the three scale schemes (`training`: model_training overrides), its server and an
    executor."""
    return started(tmp_path, redis_url, prepare=_add_scales, executor_env=executor_env, **training)


def _add_scales(config: Path) -> None:
    """The small project gets a numeric likert, a labelled likert and a slider, answered, as Potato stores
    them, for every item its annotators labelled: the stars by the review's closing sentence."""
    data = yaml.safe_load(config.read_text())
    data["annotation_schemes"] += SCHEMES
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    texts = {
        str(row["id"]): str(row["text"]) for row in json.loads((config.parent / "data" / "reviews.json").read_text())
    }
    for state_path in config.parent.glob("annotation_output/*/user_state.json"):
        state = json.loads(state_path.read_text())
        for instance_id, labels in state["instance_id_to_label_to_value"].items():
            stars = next(n for closer, n in STARS.items() if texts[instance_id].endswith(closer))
            labels += [
                [{"schema": "stars", "name": str(stars)}, str(stars)],
                [{"schema": "verdict", "name": VERDICTS[stars - 1]}, VERDICTS[stars - 1]],
                [{"schema": "score", "name": "slider"}, str(20 * stars - 10)],
            ]
        state_path.write_text(json.dumps(state))


@pytest.mark.unit
def test_what_to_label_next_reads_a_likerts_spread_not_its_margin() -> None:
    from potato_queue.insight.next_items import uncertainty

    def likert(point: int, scores: dict[str, float]) -> dict[str, Any]:
        return {"payload": {"label": point}, "scores": {str(k): scores.get(str(k), 0.0) for k in range(1, 6)}}

    assert uncertainty(likert(3, {"3": 1.0}), kind="ordinal") == 0.0
    # Half a point off on average, over half the scale (2 points): 0.25; split between both ends: 1.
    near, far = likert(3, {"3": 0.5, "4": 0.5}), likert(1, {"1": 0.5, "5": 0.5})
    assert (uncertainty(near, kind="ordinal"), uncertainty(far, kind="ordinal")) == (0.25, 1.0)
    # Read as labels with no order, both are the same coin toss between two answers.
    assert uncertainty(near) == uncertainty(far) == 1.0
