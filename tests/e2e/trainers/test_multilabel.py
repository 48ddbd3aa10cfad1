"""Multi-label schemes (a multiselect): thresholds, set scores, and sklearn-text trained on one, for real.

The scores are checked against sums done by hand; the trainer runs as users' machines run it (the worker
in a fresh process, on a bundle written in Potato's layout) and through the queue (a real server, Redis,
executor and agent on the local backend, on a project made here with a multiselect scheme).
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

from potato_queue.trainers.multilabel import choose_thresholds, set_prediction
from potato_queue.wire.scoring import score
from tests.e2e.ssh.test_ssh_backend import BACKEND, gpu_server
from tests.e2e.trainers.test_worker import run_worker, split_ids, write_bundle, write_spec
from tests.lifecycle_helpers import ADMIN_KEY, TERMINAL, Services, make_project, run_paths, started
from tests.potato_helpers import PotatoAnnotator, PotatoServer, add_potato_keys
from tests.sshd import Sshd

TOPICS = ["acting", "music", "plot"]
WORDS = {
    "acting": ["cast", "performance", "actor"],
    "music": ["score", "soundtrack", "song"],
    "plot": ["story", "twist", "ending"],
}
MULTISELECT = {
    "name": "topics",
    "annotation_type": "multiselect",
    "kind": "multilabel",
    "labels": TOPICS,
    "source_field": None,
}


@pytest.mark.unit
def test_set_scores_match_the_sums_by_hand() -> None:
    gold = {"a": ["x", "y"], "b": ["y"], "c": ["z"], "d": []}
    predicted = {"a": ["y", "x"], "b": ["x"], "c": None}
    # x: tp 1 (a), fp 1 (b) -> 2/3; y: tp 1, fn 1 (b) -> 2/3; z: fn 1 -> 0. Pooled: tp 2, fp 1, fn 2 -> 4/7.
    assert score(gold, predicted, "multilabel") == {
        "accuracy": 0.3333,
        "macro_f1": 0.4444,
        "micro_f1": 0.5714,
        "per_label_f1": {"x": 0.6667, "y": 0.6667, "z": 0.0},
        "n": 3,
    }, "d (no answer) is not scored"
    assert score({"a": ["x"]}, {"a": "x"}, "multilabel")["accuracy"] == 1.0, "a lone label is a set of one"
    assert score({}, {}, "multilabel") == {"accuracy": None, "macro_f1": None, "n": 0}


@pytest.mark.unit
def test_each_labels_threshold_is_its_best_f1_on_val_and_the_confidence_the_least_sure_decision() -> None:
    rows = [[0.9, 0.30], [0.6, 0.20], [0.4, 0.25], [0.1, 0.05]]
    gold = [["a", "b"], ["a"], ["b"], []]
    # a: 0.5 and 0.6 both keep its two positives and no negative (F1 1.0): the nearer to 0.5 wins; b's
    # positives sit at 0.30 and 0.25, under 0.5: 0.25 takes both, and no negative.
    assert choose_thresholds(["a", "b"], rows, gold) == {"a": 0.5, "b": 0.25}
    assert choose_thresholds(["a"], [[0.2], [0.7]], [[], []]) == {"a": 0.5}, "no positive in val: 0.5"
    prediction = set_prediction("i1", "topics", ["a", "b"], [0.7, 0.1], {"a": 0.6, "b": 0.25})
    assert (prediction.label, prediction.scores) == (["a"], {"a": 0.7, "b": 0.1})
    assert prediction.confidence == pytest.approx(0.7), "a chosen at 0.7, b left out at 0.9 sure: 0.7"


@pytest.mark.unit
def test_the_insight_pages_take_a_set_in_any_order_for_the_same_answer() -> None:
    from potato_queue.insight.run_data import shown

    assert shown(["plot", "acting"]) == shown(["acting", "plot"]) == '["acting", "plot"]'
    assert shown(["plot"]) == "plot" and shown([]) is None


@pytest.mark.unit
def test_what_to_label_next_reads_a_sets_labels_each_as_its_own_yes_or_no() -> None:
    from potato_queue.insight.next_items import uncertainty

    unsure = {"payload": [{"label": "a", "confidence": 0.5}], "scores": {"a": 0.5, "b": 0.5}, "confidence": 0.5}
    sure = {"payload": [{"label": "a", "confidence": 0.9}], "scores": {"a": 0.9, "b": 0.1}, "confidence": 0.9}
    assert uncertainty(unsure) == uncertainty(unsure, "entropy") == 1.0
    # margin: each label 1 - |2p - 1| = 0.2; entropy: H(0.9) = 0.469 bits for each.
    assert (uncertainty(sure), uncertainty(sure, "entropy")) == (0.2, 0.469)
    # A nominal prediction with the same scores reads them as one distribution: its top two's margin.
    assert uncertainty({"payload": {"label": "a"}, "scores": {"a": 0.9, "b": 0.1}}) == 0.2


def topic_items(n: int = 150) -> list[dict[str, Any]]:
    """Reviews whose topics are named by their words: one or two topics each; every sixth unlabelled."""
    items = []
    for i in range(n):
        chosen = [TOPICS[i % 3]] + ([TOPICS[(i + 1) % 3]] if i % 2 else [])
        words = [WORDS[t][(i // 3) % 3] for t in chosen]
        text = f"the {words[0]} was {['fine', 'great', 'odd'][i % 3]}" + (
            f" and the {words[1]} too" if len(words) > 1 else ""
        )
        items.append({"id": f"m{i:03d}", "text": text, "label": None if i % 6 == 5 else chosen})
    return items


def test_sklearn_text_trains_a_multiselect_one_classifier_per_label(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle, topic_items(), scheme=MULTISELECT)
    (tmp_path / "run").mkdir()
    run = run_worker(write_spec(tmp_path / "run", bundle, "sklearn-text", schemas=["topics"]))
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = run.only("result")["metrics"]
    assert metrics["test_accuracy"] >= 0.8 and metrics["test_micro_f1"] >= 0.9, metrics
    lines = [json.loads(line) for line in (tmp_path / "run" / "work" / "predictions.jsonl").read_text().splitlines()]
    assert {p["instance_id"] for p in lines} == split_ids(bundle, "val") | split_ids(bundle, "test") | split_ids(
        bundle, "unlabeled"
    )
    for p in lines:
        # Potato pre-fills a multiselect from a list of {label, confidence}: each label's own probability.
        chosen = [x["label"] for x in p["payload"]]
        assert set(chosen) <= set(TOPICS) and all(x["confidence"] == p["scores"][x["label"]] for x in p["payload"]), p
        assert set(p["scores"]) == set(TOPICS), "every label's probability"
        least_sure = min(s if label in chosen else 1 - s for label, s in p["scores"].items())
        assert abs(p["confidence"] - least_sure) < 1e-3, p  # the scores are rounded to 4 digits
    card = json.loads((tmp_path / "run" / "work" / "model_card.json").read_text())
    assert card["schemas"]["topics"]["kind"] == "multilabel" and set(card["schemas"]["topics"]["thresholds"]) == set(
        TOPICS
    )


def test_a_multiselect_project_trains_through_the_queue_with_set_scores(tmp_path: Path, redis_server_url: str) -> None:
    with topics_stack(tmp_path, redis_server_url) as svc:
        run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment", "topics"])
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "succeeded", (run, run_paths(svc, run_id).run_log.read_text())
        topics = run["held_out"]["topics"]["test"]
        assert set(topics) == {"accuracy", "macro_f1", "micro_f1", "per_label_f1", "n"} and topics["n"] > 0, topics
        assert set(run["held_out"]["sentiment"]["test"]) == {"accuracy", "macro_f1", "n"}, "a nominal scheme as before"
        for route in ("quality", "next"):  # the insight pages read a run of sets without failing
            status, body = svc.api("GET", f"/runs/{run_id}/{route}")
            assert status == 200, (route, body)
        again = svc.start_run(trainer="sklearn-text", schemas=["topics"], params={"C": 0.5})
        assert svc.wait_for(again, TERMINAL, 120)["state"] == "succeeded"
        status, compared = svc.api("GET", f"/runs/{run_id}/compare/{again}")
        assert status == 200, compared
        # Scored as sets: macro-F1 over the three topics, not over their combinations; micro-F1 beside it.
        assert set(compared["schemas"]["topics"]["a"]["per_label_f1"]) == {"acting", "plot", "visuals"}, compared
        status, refused = svc.api("POST", "/runs", {"trainer": "majority-baseline", "schemas": ["topics"]})
        assert status == 409, refused
        assert refused["detail"].startswith("Scheme 'topics' is multilabel (multiselect), and majority-baseline trains")
        assert (
            "train topics with hf-llm-lora or hf-text-classification or sklearn-text; majority-baseline takes sentiment here"
            in refused["detail"]
        ), refused


def test_hf_text_classification_fine_tunes_one_sigmoid_a_label_through_the_queue(
    tmp_path: Path, redis_server_url: str, tiny_model: Path
) -> None:
    """A real fine-tune (a tiny BERT built here, on the CPU) of the small project's multiselect."""
    with topics_stack(tmp_path, redis_server_url) as svc:
        run_id = svc.start_run(
            trainer="hf-text-classification",
            schemas=["topics"],
            params={
                "model_name": str(tiny_model),
                "epochs": 12,
                "batch_size": 8,
                "max_length": 16,
                "learning_rate": 5e-3,
            },
        )
        run = svc.wait_for(run_id, TERMINAL, 240)
        assert run["state"] == "succeeded", (run, run_paths(svc, run_id).run_log.read_text())
        test = run["held_out"]["topics"]["test"]
        assert test["micro_f1"] >= 0.8 and test["n"] > 0, test
        saved = run_paths(svc, run_id).artifacts / "topics"
        assert json.loads((saved / "config.json").read_text())["problem_type"] == "multi_label_classification"
        thresholds = json.loads((saved / "thresholds.json").read_text())
        assert set(thresholds) == {"acting", "plot", "visuals"} and all(0 < v <= 1 for v in thresholds.values())
        lines = [json.loads(x) for x in run_paths(svc, run_id).predictions.read_text().splitlines()]
        assert all(isinstance(p["payload"], list) and set(p["scores"]) == set(thresholds) for p in lines)


def test_hf_llm_lora_fine_tunes_a_decoder_with_one_sigmoid_a_label(
    tmp_path: Path, redis_server_url: str, tiny_llm: Path
) -> None:
    """A tiny Llama built here (on the CPU), LoRA on its attention: its head is a multiselect's sigmoids."""
    with topics_stack(tmp_path, redis_server_url) as svc:
        run_id = svc.start_run(
            trainer="hf-llm-lora",
            schemas=["topics"],
            params={
                "model_name": str(tiny_llm),
                "epochs": 10,
                "batch_size": 8,
                "grad_accum_steps": 1,
                "max_length": 12,
                "learning_rate": 1e-2,
                "lora": {"r": 8, "alpha": 16},
            },
        )
        run = svc.wait_for(run_id, TERMINAL, 300)
        assert run["state"] == "succeeded", (run, run_paths(svc, run_id).run_log.read_text())
        test = run["held_out"]["topics"]["test"]
        assert test["micro_f1"] >= 0.7 and set(test["per_label_f1"]) == {"acting", "plot", "visuals"}, test
        saved = run_paths(svc, run_id).artifacts / "topics"
        assert set(json.loads((saved / "thresholds.json").read_text())) == {"acting", "plot", "visuals"}
        lines = [json.loads(x) for x in run_paths(svc, run_id).predictions.read_text().splitlines()]
        assert all(isinstance(p["payload"], list) and len(p["scores"]) == 3 for p in lines)


def test_a_multiselect_trains_on_the_ssh_backend_too(tmp_path: Path, redis_server_url: str, sshd: Sshd) -> None:
    """A remote backend (a real sshd on 127.0.0.1): the sets and their scores cross the agent's protocol."""
    sshd.write_config("root")
    with topics_stack(
        tmp_path,
        redis_server_url,
        {"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)},
        **gpu_server(tmp_path, python=sys.executable),
    ) as svc:  # a Python with sklearn
        run_id = svc.start_run(trainer="sklearn-text", schemas=["topics"], backend=BACKEND)
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "succeeded" and run["ran_on"] == BACKEND, (run, svc.logs())
        assert set(run["held_out"]["topics"]["test"]) == {"accuracy", "macro_f1", "micro_f1", "per_label_f1", "n"}
        lines = [json.loads(x) for x in run_paths(svc, run_id).predictions.read_text().splitlines()]
        assert lines and all(isinstance(p["payload"], list) for p in lines)


def topics_stack(
    tmp_path: Path, redis_url: str, executor_env: dict[str, str] | None = None, **training: Any
) -> AbstractContextManager[Services]:
    """The small project with a multiselect (`training`: model_training overrides), its server and an executor."""
    return started(tmp_path, redis_url, prepare=_add_topics, executor_env=executor_env, **training)


def _add_topics(config: Path) -> None:
    """The small project gets a multiselect, answered for every item its annotators labelled."""
    data = yaml.safe_load(config.read_text())
    data["annotation_schemes"].append(
        {
            "annotation_type": "multiselect",
            "name": "topics",
            "labels": ["acting", "plot", "visuals"],
            "description": "Topics",
        }
    )
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    _annotate_topics(config.parent)


# What each review of the small project talks about, by its subject ("The cast was ...").
SUBJECT_TOPICS = {
    "cast": ["acting"],
    "dialogue": ["acting", "plot"],
    "story": ["plot"],
    "script": ["plot"],
    "ending": ["plot"],
    "pacing": ["plot", "visuals"],
    "camera work": ["visuals"],
    "direction": ["acting", "visuals"],
    "film": ["plot", "visuals"],
    "soundtrack": ["visuals"],
}


def _annotate_topics(project: Path) -> None:
    """Adds a topics answer, as Potato stores a multiselect's, to every item the annotators labelled."""
    items = {str(row["id"]): str(row["text"]) for row in _items(project)}
    for state_path in project.glob("annotation_output/*/user_state.json"):
        state = json.loads(state_path.read_text())
        for instance_id, labels in state["instance_id_to_label_to_value"].items():
            subject = next(s for s in SUBJECT_TOPICS if items[instance_id].startswith(f"The {s} "))
            labels.extend([[{"schema": "topics", "name": t}, t] for t in SUBJECT_TOPICS[subject]])
        state_path.write_text(json.dumps(state))


def _items(project: Path) -> list[dict[str, Any]]:
    config = yaml.safe_load((project / "config.yaml").read_text())
    rows: list[dict[str, Any]] = []
    for path in config["data_files"]:
        text = (project / path).read_text()
        rows += json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x]
    return rows


def test_potato_pre_checks_a_multiselect_from_the_runs_set_of_labels(tmp_path: Path, redis_server_url: str) -> None:
    """Potato 2.12.1 itself (its server, model-review serving): the labels of the set come pre-checked."""
    config = make_project(
        tmp_path, grace_seconds=2, writeback={"schemas": ["topics"], "include_unlabeled": True, "min_confidence": 0.0}
    )
    add_potato_keys(config)
    _add_topics(config)
    potato, svc = PotatoServer(config, tmp_path, ADMIN_KEY), Services(config, redis_server_url, tmp_path)
    try:
        svc.serve()
        svc.executor()
        run_id = svc.start_run(trainer="sklearn-text", schemas=["topics"])
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "succeeded", (run, svc.logs())
        potato.start()  # it publishes the run's prelabels as it starts
        page = potato.first_page_of("erin")
        served = PotatoAnnotator.ITEM.search(page)
        assert served, page[-3000:]
        lines = [json.loads(x) for x in run_paths(svc, run_id).predictions.read_text().splitlines()]
        predicted = next(p for p in lines if p["instance_id"] == served.group(1))
        labels = [x["label"] for x in predicted["payload"]]
        assert labels, "an empty set is never published"
        checked = re.findall(r'<input checked="True"[^>]*value="([^"]+)"', page)
        assert sorted(checked) == sorted(labels), (checked, labels)
    finally:
        svc.stop()
        potato.stop()
