"""A trainer runs only on the schema kinds it declares.

The project is tests/fixtures/two_annotators: a radio (nominal), a multiselect (multilabel), a likert
(ordinal), a slider (continuous), a span and a textbox scheme, as Potato 2.12 configures them. The refusal
is checked where users meet it: the admin API (409, through a real server on a real Redis), the command
line (exit 1), the beat's and `up`'s choice of schemes, and the worker itself, whose spec names its
schemes and takes their kind from the bundle.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from potato_queue.errors import Conflict
from potato_queue.runs.kinds import refuse_foreign_kinds, trainable_schemas
from potato_queue.trainers import trainers_for_kind, trainers_for_modality
from potato_queue.validate import load_checked
from tests.conftest import ROOT, run_cli
from tests.e2e.trainers.test_worker import SCHEMA, run_worker, write_bundle, write_spec
from tests.lifecycle_helpers import Services, make_project

FIXTURE = ROOT / "tests" / "fixtures" / "two_annotators"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path, source=FIXTURE)


@pytest.mark.unit
def test_a_foreign_kind_is_refused_naming_the_kind_and_what_takes_it(project: Path) -> None:
    config = load_checked(project)
    assert trainable_schemas(config, "majority-baseline") == ["sentiment"], "the multiselect, likert, slider, span not"
    assert trainable_schemas(config, "sklearn-text") == ["sentiment", "topics", "quality", "intensity"]
    with pytest.raises(Conflict) as refused:
        refuse_foreign_kinds(config, "majority-baseline", ["sentiment", "topics"])
    assert refused.value.message == (
        "Scheme 'topics' is multilabel (multiselect), and majority-baseline trains only nominal schemes"
    )
    assert trainers_for_modality("multilabel", "text") == ["hf-llm-lora", "hf-text-classification", "sklearn-text"]
    assert trainers_for_kind("multilabel") == [
        "hf-image-classification",
        "hf-llm-lora",
        "hf-text-classification",
        "sklearn-text",
    ]
    assert (
        refused.value.fix
        == "train topics with hf-llm-lora or hf-text-classification or sklearn-text; majority-baseline takes sentiment here"
    )
    with pytest.raises(Conflict) as refused:
        refuse_foreign_kinds(config, "sklearn-text", ["highlight"])
    assert refused.value.message == (
        "Scheme 'highlight' is span (span), and sklearn-text trains only nominal/multilabel/ordinal/continuous schemes"
    )
    assert refused.value.fix == (
        "train highlight with hf-token-classification; sklearn-text takes sentiment, topics, quality, intensity here"
    )
    with pytest.raises(Conflict) as refused:
        refuse_foreign_kinds(config, "sklearn-text", ["notes"])
    assert refused.value.message == (
        "Scheme 'notes' is textbox (Potato's kind: text), which no trainer trains: its answer is free text"
    )
    assert refused.value.fix.startswith("leave notes out of the run; sklearn-text takes sentiment, topics, quality")
    refuse_foreign_kinds(config, "sklearn-text", ["sentiment", "topics", "quality"])  # kinds it declares: no refusal


@pytest.fixture
def server(project: Path, tmp_path: Path, redis_server_url: str) -> Iterator[Services]:
    svc = Services(project, redis_server_url, tmp_path)
    svc.serve()
    try:
        yield svc
    finally:
        svc.stop()


def test_the_api_and_the_command_line_refuse_before_queueing(server: Services, project: Path) -> None:
    status, reply = server.api("POST", "/runs", {"trainer": "sklearn-text", "schemas": ["sentiment", "highlight"]})
    assert status == 409, reply
    assert reply["detail"].startswith(
        "Scheme 'highlight' is span (span), and sklearn-text trains only nominal/multilabel/ordinal/continuous schemes"
    )
    assert server.api("GET", "/runs")[1] == [], "nothing was queued"
    done = run_cli(
        "training",
        "run",
        project,
        "--trainer",
        "majority-baseline",
        "--schema",
        "intensity",
        env={"POTATO_QUEUE_REDIS_URL": server.redis_url},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "Scheme 'intensity' is continuous (slider), and majority-baseline trains only nominal schemes" in said
    assert "majority-baseline takes sentiment here" in said


def test_the_worker_takes_a_named_schemes_kind_from_the_bundle_and_refuses_a_foreign_one(tmp_path: Path) -> None:
    """The server's job names schemes only; the worker used to take every one for nominal."""
    bundle = tmp_path / "bundle"
    manifest = write_bundle(bundle)
    for name in ("nominal", "multilabel"):
        (tmp_path / name).mkdir()
    named = run_worker(write_spec(tmp_path / "nominal", bundle, "majority-baseline", schemas=[SCHEMA]))
    assert named.returncode == 0, named.stderr
    manifest["schemas"][0].update(annotation_type="multiselect", kind="multilabel")
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    refused = run_worker(write_spec(tmp_path / "multilabel", bundle, "majority-baseline", schemas=[SCHEMA]))
    assert refused.returncode == 2, refused.stderr
    assert (
        "Schema 'sentiment' is multilabel; majority-baseline fits nominal schemas" in refused.only("error")["message"]
    )
