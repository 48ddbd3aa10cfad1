"""A pairwise comparison trains as a reward model: sklearn-text learns which of two texts people prefer from
the difference of the texts' features, where a bag of words over both texts could not tell the sides apart.
A real run on the local backend (server, executor, agent, worker)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml

from tests.lifecycle_helpers import ADMIN_KEY, TERMINAL, Services, run_paths

GOOD = ["clear", "helpful", "correct", "polite", "precise", "thorough"]
BAD = ["rude", "wrong", "vague", "confusing", "sloppy", "useless"]
FILLER = ["the", "answer", "was", "quite", "and", "very", "overall", "reply"]


def _reply(rng: random.Random, words: list[str]) -> str:
    return " ".join(rng.sample(FILLER, 4) + rng.sample(words, 2))


def _preference_project(root: Path, n: int = 160) -> Path:
    """Items of two replies each (Potato's `text: [A, B]`), one good and one bad in a random order; three
    annotators prefer the good one (A or B by where it is), as Potato stores a binary pairwise answer."""
    rng = random.Random(3)
    (root / "data").mkdir(parents=True)
    items, truth = [], {}
    for i in range(n):
        good_first = rng.random() < 0.5
        good, bad = _reply(rng, GOOD), _reply(rng, BAD)
        items.append({"id": f"q{i:03d}", "text": [good, bad] if good_first else [bad, good]})
        truth[f"q{i:03d}"] = "A" if good_first else "B"
    (root / "data" / "pairs.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    scheme = {"annotation_type": "pairwise", "name": "better", "description": "Which reply is better?"}
    config = {
        "annotation_task_name": "reply preference",
        "task_dir": ".",
        "data_files": ["data/pairs.jsonl"],
        "item_properties": {"id_key": "id", "text_key": "text"},
        "admin_api_key": ADMIN_KEY,
        "annotation_schemes": [{**scheme, "mode": "binary", "labels": ["Reply A", "Reply B"]}],
        "model_training": {"enabled": True},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    for user in ("ann", "ben", "cai"):
        answers = {iid: [[{"schema": "better", "name": "selection"}, said]] for iid, said in truth.items()}
        (root / "annotation_output" / user).mkdir(parents=True)
        (root / "annotation_output" / user / "user_state.json").write_text(
            json.dumps({"user_id": user, "instance_id_to_label_to_value": answers})
        )
    return root / "config.yaml"


def test_sklearn_text_learns_which_of_two_replies_people_prefer(tmp_path: Path, redis_server_url: str) -> None:
    config = _preference_project(tmp_path / "project")
    svc = Services(config, redis_server_url, tmp_path)
    try:
        svc.serve()
        svc.executor()
        run_id = svc.start_run(trainer="sklearn-text", schemas=["better"])
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "succeeded", (run, svc.logs())
    finally:
        svc.stop()
    test = run["held_out"]["better"]["test"]
    assert test["n"] >= 15 and test["accuracy"] >= 0.9, test
    predicted = [json.loads(x)["payload"]["label"] for x in run_paths(svc, run_id).predictions.read_text().splitlines()]
    assert set(predicted) == {"A", "B"}, "it tells the sides apart"
