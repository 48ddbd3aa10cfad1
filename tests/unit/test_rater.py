"""A run's machine rater, in process: the user state it writes (Potato's encoding, held-out items only, the
origin naming the model and run), and the rule that a machine rater's answers are no annotator's to the
bundle (Potato's own rule for origin: absent means human, anything else a machine). Against Potato itself:
tests/e2e/potato/test_potato_rater.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from potato_queue.bundle.annotations import annotator_files, answered_ids, count_annotations, read_annotations
from potato_queue.bundle.inputs import inputs_digest
from potato_queue.bundle.user_state import is_machine_state
from potato_queue.runs.rater import rater_id, rater_state
from potato_queue.validate import load_checked
from tests.lifecycle_helpers import make_project

pytestmark = pytest.mark.unit

RECORD = {"run_id": "20261206T120000-abc123", "trainer": "sklearn-text", "schemas": ["sentiment", "topics", "mood"]}
KINDS = {"sentiment": "nominal", "topics": "multilabel", "mood": "ordinal", "intensity": "continuous"}


def prediction(iid: str, schema: str, label: Any) -> dict[str, Any]:
    payload = [{"label": x, "confidence": 0.9} for x in label] if isinstance(label, list) else {"label": label}
    return {"instance_id": iid, "schema_name": schema, "payload": payload, "confidence": 0.9}


def test_the_state_answers_held_out_items_in_potatos_encoding_and_names_the_model_and_run() -> None:
    predictions = [
        prediction("v1", "sentiment", "positive"),
        prediction("v1", "topics", ["plot", "music"]),
        prediction("v1", "mood", 4),
        prediction("v1", "intensity", 0.7),  # continuous: not written
        prediction("t1", "sentiment", "negative"),
        prediction("tr1", "sentiment", "positive"),  # its own train split: never
        prediction("u1", "sentiment", "positive"),  # unlabelled: not held out either
    ]
    state = rater_state({**RECORD, "model_version": "v7", "params": {}}, predictions, {"v1", "t1"}, KINDS)
    assert state["user_id"] == "potato-queue.sklearn-text.mood+sentiment+topics" == state["origin"]["id"]
    assert state["instance_id_ordering"] == ["t1", "v1"]
    assert state["instance_id_to_label_to_value"] == {
        "t1": [[{"schema": "sentiment", "name": "negative"}, "negative"]],
        "v1": [
            [{"schema": "sentiment", "name": "positive"}, "positive"],
            [{"schema": "topics", "name": "plot"}, "plot"],
            [{"schema": "topics", "name": "music"}, "music"],
            [{"schema": "mood", "name": "4"}, "4"],
        ],
    }
    origin = state["origin"]
    assert (origin["kind"], origin["tool"], origin["model"], origin["version"], origin["run_id"]) == (
        "tool",
        "potato-queue",
        "sklearn-text",
        "v7",
        RECORD["run_id"],
    )
    assert is_machine_state(state)


def test_an_llm_trainers_rater_is_of_kind_llm_and_names_its_base_model() -> None:
    record = {**RECORD, "trainer": "hf-llm-lora", "schemas": ["sentiment"], "params": {"model_name": "org/tiny"}}
    state = rater_state(record, [prediction("v1", "sentiment", "positive")], {"v1"}, KINDS)
    assert (state["origin"]["kind"], state["origin"]["model"]) == ("llm", "org/tiny")
    assert rater_id("hf llm/x", ["b", "a"]) == "potato-queue.hf_llm_x.a+b"


@pytest.mark.parametrize(
    ("origin", "machine"),
    [
        (None, False),
        ({}, False),
        ({"kind": "human"}, False),
        ({"kind": "tool"}, True),
        ({"kind": 7}, True),
        ("x", True),
    ],
)
def test_origin_reads_as_potato_reads_it(origin: Any, machine: bool) -> None:
    """Absent means human; present but unreadable means machine (potato/annotator_origin.py)."""
    assert is_machine_state({} if origin is None else {"origin": origin}) is machine


def test_a_machine_raters_answers_are_no_annotators_to_the_bundle(tmp_path: Path) -> None:
    config = load_checked(make_project(tmp_path))
    before = (read_annotations(config)[0].users, count_annotations(config, ["sentiment"]), answered_ids(config))
    digest = inputs_digest(config, ["sentiment"])
    answers = {"zz-new-item": [[{"schema": "sentiment", "name": "negative"}, "negative"]]}
    for folder, origin in (
        ("gpt-judge", {"kind": "llm", "id": "gpt-judge"}),
        ("potato-queue.x.sentiment", {"kind": "tool"}),
    ):
        (config.output_path / folder).mkdir()
        state = {"user_id": folder, "instance_id_to_label_to_value": answers, "origin": origin}
        (config.output_path / folder / "user_state.json").write_text(json.dumps(state))
    after = (read_annotations(config)[0].users, count_annotations(config, ["sentiment"]), answered_ids(config))
    assert after == before, "no vote, no new work, no answered item"
    assert "potato-queue.x.sentiment" not in [name for name, _ in annotator_files(config)]
    assert "gpt-judge" in [name for name, _ in annotator_files(config)], "another tool's rater is read, then left out"
    (config.output_path / "gpt-judge" / "user_state.json").unlink()
    assert inputs_digest(config, ["sentiment"]) == digest, "our rater's writes change no bundle's inputs"
