"""Potato's own example projects train through the queue as a new user's would, and land in Potato 2.12.1
itself: the run, its held-out scores in the kind's own measures, every prediction in Potato's store (read
through Potato's functions), and for a multiselect over CSV data, the prelabels Potato publishes at its
start. Three annotators' answers are added in Potato's stored shapes (tests/potato_examples.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.lifecycle_helpers import ADMIN_KEY, TERMINAL, Services, run_paths
from tests.potato_examples import example_project, items_of
from tests.potato_helpers import POTATO_KEYS, PotatoServer, potato_view

# (example, scheme, trainer, a held-out measure of the scheme's kind, what every prediction's label is)
TRAINED = [
    ("single-choice", "favorite_color", "sklearn-text", "macro_f1", {"pizza", "bagels", "burgers", "curry", "tacos"}),
    ("likert", "awesomeness", "sklearn-text", "qwk", {1, 2, 3, 4, 5}),
    ("slider", "awesomeness", "sklearn-text", "mae", set(range(0, 101))),
    ("pairwise-comparison", "preference", "sklearn-text", "macro_f1", {"A", "B", "tie"}),
    ("pairwise-scale", "preference_scale", "sklearn-text", "mae", set(range(-3, 4))),
    ("triage", "data_quality", "sklearn-text", "macro_f1", {"accept", "reject", "skip"}),
    ("vas", "pain_level", "sklearn-text", None, None),  # five items: no held-out item is certain
    (
        "multirate",
        "awesomeness:Option 2",
        "sklearn-text",
        "qwk",
        {"Strongly disagree", "Disagree", "Neutral", "Agree", "Strongly Agree"},
    ),
]


def _labels(path: Path) -> list[Any]:
    out = []
    for line in path.read_text().splitlines():
        payload = json.loads(line)["payload"]
        out.append(payload.get("label") if isinstance(payload, dict) else payload)
    return out


@pytest.mark.parametrize(("example", "scheme", "trainer", "measure", "labels"), TRAINED, ids=[t[0] for t in TRAINED])
def test_an_example_project_trains_with_its_kinds_scores_and_its_predictions_reach_potatos_store(
    tmp_path: Path, redis_server_url: str, example: str, scheme: str, trainer: str, measure: str | None, labels: Any
) -> None:
    from potato.training import store

    config = example_project(example, tmp_path / "project", top={"admin_api_key": ADMIN_KEY})
    svc = Services(config, redis_server_url, tmp_path)
    try:
        svc.serve()
        svc.executor()
        run_id = svc.start_run(trainer=trainer, schemas=[scheme])
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "succeeded", (run, svc.logs())
    finally:
        svc.stop()
    held = run["held_out"][scheme]
    if measure is not None:
        assert isinstance(held["val"].get(measure), float) or isinstance(held["test"].get(measure), float), held
    predicted = _labels(run_paths(svc, run_id).predictions)
    assert predicted, "predictions for the held-out items"
    if labels is not None:
        assert set(predicted) <= labels, (set(predicted), labels)
    stored = store.load_predictions(potato_view(config), run_id=run_id)
    assert len(stored) == len(predicted), "every prediction is a row of Potato's store"
    assert store.load_run(potato_view(config), run_id).status == "success"


PRELABELLED = [
    ("check-box", "favorite_color", "micro-F1"),  # CSV data: Potato's own training reads none of its items
    ("single-choice", "favorite_color", "acc"),
    ("slider", "awesomeness", "MAE"),
]


@pytest.mark.parametrize(("example", "scheme", "measure"), PRELABELLED, ids=[p[0] for p in PRELABELLED])
def test_an_example_is_trained_as_the_readme_says_and_prelabelled_in_potato_itself(
    tmp_path: Path, redis_server_url: str, example: str, scheme: str, measure: str
) -> None:
    """`potato-queue up CONFIG --run sklearn-text` on the example trains on all its items and prints the
    kind's own measure; Potato, started on the project, publishes the run's prelabels."""
    config = example_project(
        example,
        tmp_path / "project",
        top={"admin_api_key": ADMIN_KEY, **POTATO_KEYS},
        writeback={"schemas": [scheme], "include_unlabeled": True},
    )
    proc = run_cli("up", config, "--run", "sklearn-text", "--port", "0", timeout_s=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{scheme:<20} test" in proc.stdout and measure in proc.stdout, proc.stdout
    runs = list((tmp_path / "project").rglob("run.json"))
    (record,) = [json.loads(p.read_text()) for p in runs]
    assert record["state"] == "succeeded" and sum(record["bundle"]["n"].values()) == len(items_of(config)), record
    potato = PotatoServer(config, tmp_path, ADMIN_KEY)
    try:
        potato.start()
        assert potato.restored() > 0, potato.log()
        reply = potato.api("GET", "/admin/model-review")[1]
        assert reply["n_prelabelled"] > 0 or example == "slider", reply  # a slider's has no confidence to rank
    finally:
        potato.stop()


@pytest.mark.parametrize("example", ["multirate", "text-box", "ranking"])
def test_an_example_of_a_type_no_run_trains_is_refused_by_the_command_line_with_its_type_and_kind(
    tmp_path: Path, redis_server_url: str, example: str
) -> None:
    config = example_project(example, tmp_path / "project")
    scheme = next(iter(_schemes(config)))
    proc = run_cli("training", "run", config, "--trainer", "majority-baseline", "--schema", scheme["name"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"error: Scheme '{scheme['name']}' is {scheme['annotation_type']} (Potato's kind: " in proc.stderr
    assert "which no trainer trains: " in proc.stderr and not list(tmp_path.rglob("run.json"))


def _schemes(config: Path) -> list[dict[str, Any]]:
    import yaml

    return list(yaml.safe_load(config.read_text())["annotation_schemes"])


def test_potatos_span_example_over_csv_data_tags_spans_through_the_queue(
    tmp_path: Path, redis_server_url: str, tiny_model: Path
) -> None:
    """Potato's span-labeling example (CSV data, two span labels): hf-token-classification fine-tunes a tiny
    model on it, scores it with the span measures, and every prediction is spans inside its item's text."""
    from potato.training import store

    config = example_project("span-labeling", tmp_path / "project", top={"admin_api_key": ADMIN_KEY})
    svc = Services(config, redis_server_url, tmp_path)
    params = {"model_name": str(tiny_model), "epochs": 2, "batch_size": 16, "max_length": 24}
    try:
        svc.serve()
        svc.executor()
        run_id = svc.start_run(trainer="hf-token-classification", schemas=["certainty"], params=params)
        run = svc.wait_for(run_id, TERMINAL, 240)
        assert run["state"] == "succeeded", (run, svc.logs())
    finally:
        svc.stop()
    test = run["held_out"]["certainty"]["test"]
    assert test["n"] > 10 and isinstance(test["f1"], float) and isinstance(test["partial_f1"], float), test
    lines = [json.loads(x) for x in run_paths(svc, run_id).predictions.read_text().splitlines()]
    spans = [s for p in lines for s in p["payload"]]
    assert all(s["label"] in ("certain", "uncertain") and 0 <= s["start"] < s["end"] for s in spans), spans[:3]
    assert len(store.load_predictions(potato_view(config), run_id=run_id)) == len(lines)
