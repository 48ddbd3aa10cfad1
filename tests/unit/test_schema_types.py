"""Every annotation type Potato 2.12.1 registers, classified as Potato classifies it, and each either trained
(its answers read in the shape Potato stores them) or refused with its type, kind and why.

Potato itself is the reference: its `classify_schema` over its own registry of types, its example projects
(tests/fixtures/potato_examples) with answers in its stored shapes (tests/potato_examples.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from potato_queue.bundle import build_bundle, schema_kind, target_schemas
from potato_queue.errors import ConfigError, Conflict, PotatoQueueError
from potato_queue.runs.kinds import refuse_foreign_kinds
from potato_queue.schemes import SCHEMA_TYPES, refusal, refusal_text
from potato_queue.validate import check_file, load_checked
from tests.conftest import ROOT
from tests.potato_examples import example_project

pytestmark = pytest.mark.unit


def _potato_types() -> list[str]:
    from potato.server_utils.iaa.dispatcher import _KIND_BY_TYPE
    from potato.server_utils.schemas.registry import schema_registry

    return sorted(set(schema_registry.get_supported_types()) | set(_KIND_BY_TYPE))


# The config keys that change a kind (Potato's classify_schema reads them).
VARIANTS: list[dict[str, Any]] = [
    {},
    {"max_choices": 1},
    {"max_selections": 1},
    {"scale_type": "slider"},
    {"mode": "scale"},
    {"mode": "multi_dimension"},
    {"mode": "binary"},
    {"mode": " Scale "},
]


@pytest.mark.parametrize("atype", _potato_types())
def test_every_type_potato_has_is_in_the_table_with_potatos_kind(atype: str) -> None:
    from potato.server_utils.iaa.dispatcher import classify_schema

    assert atype in SCHEMA_TYPES, f"{atype} is a Potato type the table lacks"
    for extra in VARIANTS:
        scheme = {"annotation_type": atype, "name": "s", **extra}
        assert schema_kind(scheme) == classify_schema(scheme).value, (atype, extra)
    assert schema_kind({"annotation_type": atype.upper()}) == classify_schema({"annotation_type": atype.upper()}).value


def test_the_table_holds_no_type_potato_lacks_and_every_refusal_says_why() -> None:
    assert set(SCHEMA_TYPES) == set(_potato_types())
    trained = sorted(t for t in SCHEMA_TYPES if refusal({"annotation_type": t}) is None)
    assert trained == [
        "confidence",
        "hierarchical_multiselect",
        "likert",
        "multiselect",
        "number",
        "pairwise",
        "radio",
        "select",
        "slider",
        "span",
        "triage",
        "vas",
    ]
    assert refusal({"annotation_type": "pairwise", "mode": "multi_dimension"}) is not None
    assert refusal({"annotation_type": "no_such_type"}) == "Potato 2.12 has no annotation type 'no_such_type'"
    said = refusal_text({"annotation_type": "multirate", "name": "awesomeness"})
    assert said == (
        "Scheme 'awesomeness' is multirate (Potato's kind: matrix), which no trainer trains: its answer is a "
        "rating per row (a matrix): each row trains as a scheme of its own, named <scheme>:<row>"
    )


def test_the_docs_type_table_lists_every_type_with_its_kind_and_whether_it_trains() -> None:
    text = (ROOT / "docs" / "trainers.md").read_text()
    for atype, row in SCHEMA_TYPES.items():
        line = next((x for x in text.splitlines() if x.startswith(f"| `{atype}` |")), None)
        assert line is not None, f"docs/trainers.md has no row for {atype}"
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1].startswith(row.kind), (atype, cells)
        if atype != "pairwise":  # trained in two of its modes, refused in the third
            assert cells[3].startswith("refused") == (row.refused is not None), (atype, cells)


def _targets(bundle: Path) -> dict[str, Any]:
    rows = [json.loads(x) for s in ("train", "val", "test") for x in (bundle / f"{s}.jsonl").read_text().splitlines()]
    return {row["instance_id"]: row for row in rows}


def test_a_pairwise_comparison_trains_on_a_b_tie_over_both_texts_not_on_the_name_selection(tmp_path: Path) -> None:
    config_path = example_project("pairwise-comparison", tmp_path / "project")
    manifest = build_bundle(load_checked(config_path), tmp_path / "bundle")
    rows = _targets(tmp_path / "bundle")
    assert manifest["labels"]["preference"] == ["A", "B", "tie"], "Potato's own bundle says ['selection']"
    assert {row["targets"]["preference"] for row in rows.values()} <= {"A", "B", "tie"}
    first = rows["1"]
    assert first["pair"] == ["Isn't this awesome?!", "I like you"]
    assert first["text"] == "A: Isn't this awesome?!\n\nB: I like you", "both texts, not a list's repr"
    assert list(first) == ["instance_id", "text", "targets", "pair"]


def test_a_pair_shown_swapped_is_read_in_the_data_files_order(tmp_path: Path) -> None:
    """randomize_order: Potato records the order it showed; an "A" of a pair shown swapped is the file's B."""
    config_path = example_project("pairwise-comparison", tmp_path / "project", n_annotators=1)
    state_path = next((tmp_path / "project" / "annotation_output").rglob("user_state.json"))
    state = json.loads(state_path.read_text())
    answers = state["instance_id_to_label_to_value"]
    for iid in answers:
        answers[iid] = [[{"schema": "preference", "name": "selection"}, "A"]]
    state["instance_id_to_presentation_order"] = {"1": {"preference": [1, 0]}, "2": {"preference": [0, 1]}}
    state_path.write_text(json.dumps(state))
    build_bundle(load_checked(config_path), tmp_path / "bundle")
    rows = _targets(tmp_path / "bundle")
    assert rows["1"]["targets"]["preference"] == "B" and rows["2"]["targets"]["preference"] == "A"


def test_a_pairwise_scale_is_a_number_on_its_own_scale(tmp_path: Path) -> None:
    config_path = example_project("pairwise-scale", tmp_path / "project")
    build_bundle(load_checked(config_path), tmp_path / "bundle")
    values = {row["targets"]["preference_scale"] for row in _targets(tmp_path / "bundle").values()}
    assert values and values <= {float(v) for v in range(-3, 4)}
    scales = json.loads((tmp_path / "bundle" / "scales.json").read_text())
    assert scales["preference_scale"] == {"min": -3, "max": 3, "step": 1}


@pytest.mark.parametrize(
    ("scheme", "stored", "target", "scale"),
    [
        ({"annotation_type": "select", "labels": ["x", "y"]}, [["select-one", "y"]], "y", None),
        ({"annotation_type": "triage"}, [["decision", "reject"]], "reject", None),
        ({"annotation_type": "vas"}, [["s", "73.4"]], 73.4, {"min": 0, "max": 100, "step": 0.1}),
        ({"annotation_type": "number", "min": 0, "max": 9}, [["number", "7"]], 7.0, {"min": 0, "max": 9}),
        (
            {"annotation_type": "confidence", "labels": ["Guessing", "Sure"], "scale_points": 3},
            [["2", "2"]],
            2.0,
            {"points": [1, 2, 3]},
        ),
        (
            {"annotation_type": "confidence", "scale_type": "slider"},
            [["confidence_level", "70"]],
            70.0,
            {"min": 0, "max": 100, "step": 1},
        ),
        ({"annotation_type": "slider", "min_value": 0, "max_value": 10}, [["slider", "4"]], 4.0, None),
        (
            {"annotation_type": "hierarchical_multiselect", "taxonomy": {"Joy": [], "Anger": []}},
            [["selected_labels", "Anger,Joy"]],
            ["Anger", "Joy"],
            None,
        ),
    ],
    ids=["select", "triage", "vas", "number", "confidence", "confidence-slider", "slider", "hierarchical"],
)
def test_each_trained_type_is_read_in_the_shape_potato_stores_it(
    tmp_path: Path, scheme: dict[str, Any], stored: list[list[str]], target: Any, scale: Any
) -> None:
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "data" / "items.jsonl").write_text(
        "".join(json.dumps({"id": f"i{n}", "text": f"t {n}"}) + "\n" for n in range(8))
    )
    scheme = {"name": "s", "description": "d", **scheme}
    config = {"task_dir": ".", "data_files": ["data/items.jsonl"], "annotation_schemes": [scheme]}
    config["model_training"] = {"enabled": True}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    answers = {f"i{n}": [[{"schema": "s", "name": name}, value] for name, value in stored] for n in range(8)}
    (root / "annotation_output" / "ann").mkdir(parents=True)
    (root / "annotation_output" / "ann" / "user_state.json").write_text(
        json.dumps({"user_id": "ann", "instance_id_to_label_to_value": answers})
    )
    build_bundle(load_checked(root / "config.yaml"), tmp_path / "bundle")
    found = {json.dumps(row["targets"]["s"]) for row in _targets(tmp_path / "bundle").values()}
    assert found == {json.dumps(target)}, found
    if scale is not None:
        assert json.loads((tmp_path / "bundle" / "scales.json").read_text())["s"] == scale
    if scheme["annotation_type"] == "slider":  # no step in the config: Potato's slider draws step 1
        assert json.loads((tmp_path / "bundle" / "scales.json").read_text())["s"]["step"] == 1


@pytest.mark.parametrize("example", ["multirate", "text-box", "ranking"])
def test_an_example_of_a_refused_type_is_refused_everywhere_with_its_type_and_kind(
    tmp_path: Path, example: str
) -> None:
    config_path = example_project(example, tmp_path / "project")
    config = load_checked(config_path)
    scheme = config.annotation_schemes[0]
    said = refusal_text(scheme)
    assert said is not None and f"is {scheme['annotation_type']} (Potato's kind: {schema_kind(scheme)})" in said
    rows = [f"awesomeness:Option {n}" for n in (1, 2, 3)] if example == "multirate" else []
    assert target_schemas(config) == rows, "a multirate's rows train, each a scheme of its own"
    with pytest.raises(PotatoQueueError) as built:
        build_bundle(config, tmp_path / "bundle", [scheme["name"]])
    assert built.value.message == said
    with pytest.raises(Conflict) as refused:
        refuse_foreign_kinds(config, "majority-baseline", [scheme["name"]])
    assert refused.value.message == said
    data = yaml.safe_load(config_path.read_text())
    data["model_training"]["writeback"] = {"schemas": [scheme["name"]]}
    config_path.write_text(yaml.safe_dump(data))
    errors = check_file(config_path).errors
    assert any(e.startswith(f"model_training.writeback.schemas names {scheme['name']!r}: {said}") for e in errors)
    with pytest.raises(ConfigError):
        load_checked(config_path)


@pytest.mark.parametrize("atype", sorted(t for t, row in SCHEMA_TYPES.items() if row.refused))
def test_validate_refuses_each_refused_type_named_for_training_with_its_type_kind_and_why(
    tmp_path: Path, atype: str
) -> None:
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "data" / "items.jsonl").write_text('{"id": "1", "text": "a"}\n')
    scheme = {"annotation_type": atype, "name": "s", "description": "d"}
    config = {
        "task_dir": ".",
        "data_files": ["data/items.jsonl"],
        "annotation_schemes": [scheme],
        "model_training": {"enabled": True, "writeback": {"schemas": ["s"]}},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    errors = check_file(root / "config.yaml").errors
    kind = schema_kind(scheme)
    said = (
        f"model_training.writeback.schemas names 's': Scheme 's' is {atype} (Potato's kind: {kind}), which no trainer"
    )
    assert any(e.startswith(said) and SCHEMA_TYPES[atype].refused in e for e in errors), errors


def test_compare_and_agreement_read_each_annotators_pairwise_answer_as_a_b_or_tie(tmp_path: Path) -> None:
    from potato_queue.insight.compare import annotator_labels

    config = load_checked(example_project("pairwise-comparison", tmp_path / "project"))
    labels = annotator_labels(config, {str(n) for n in range(1, 12)})
    said = {label for by_scheme in labels.values() for label in by_scheme["preference"].values()}
    assert said and said <= {"A", "B", "tie"}, said


def test_a_multirates_rows_train_as_labelled_likerts_each_read_from_the_multirates_answers(tmp_path: Path) -> None:
    config = load_checked(example_project("multirate", tmp_path / "project", n_annotators=1))
    scheme = next(s for s in config.annotation_schemes if s["name"] == "awesomeness:Option 2")
    assert (scheme["annotation_type"], schema_kind(scheme)) == ("likert", "ordinal")
    build_bundle(config, tmp_path / "bundle")
    state = json.loads(next((tmp_path / "project" / "annotation_output").rglob("user_state.json")).read_text())
    said = {
        iid: {label["name"]: value for label, value in answers}
        for iid, answers in state["instance_id_to_label_to_value"].items()
    }
    for iid, row in _targets(tmp_path / "bundle").items():
        assert row["targets"] == {f"awesomeness:{name}": value for name, value in said[iid].items()}, iid
    labels = ["Strongly disagree", "Disagree", "Neutral", "Agree", "Strongly Agree"]
    scales = json.loads((tmp_path / "bundle" / "scales.json").read_text())
    assert scales["awesomeness:Option 3"] == {"points": labels}


def test_a_recorded_order_moves_only_a_pairs_answer_and_a_malformed_multirate_is_no_crash(tmp_path: Path) -> None:
    """Potato records the shown order of a multirate's ratings too (as their names: here the numbers 1..3);
    only a pair's order changes what an answer means, so a multirate row's rating is never negated."""
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "data" / "items.jsonl").write_text(
        "".join(json.dumps({"id": f"i{n}", "text": f"t {n}"}) + "\n" for n in range(6))
    )
    scheme = {
        "annotation_type": "multirate",
        "name": "m",
        "description": "d",
        "options": ["Speed"],
        "labels": [1, 2, 3],
    }
    config = {"task_dir": ".", "data_files": ["data/items.jsonl"], "annotation_schemes": [scheme]}
    config["model_training"] = {"enabled": True}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    state = {
        "user_id": "ann",
        "instance_id_to_label_to_value": {f"i{n}": [[{"schema": "m", "name": "Speed"}, "2"]] for n in range(6)},
        "instance_id_to_presentation_order": {f"i{n}": {"m": [1, 2, 3]} for n in range(6)},
    }
    (root / "annotation_output" / "ann").mkdir(parents=True)
    (root / "annotation_output" / "ann" / "user_state.json").write_text(json.dumps(state))
    build_bundle(load_checked(root / "config.yaml"), tmp_path / "bundle")
    assert {row["targets"]["m:Speed"] for row in _targets(tmp_path / "bundle").values()} == {2.0}
    config["annotation_schemes"].append({"annotation_type": "multirate", "name": "bad", "options": 5, "labels": 5})
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    report = check_file(root / "config.yaml")  # options and labels that are not lists: no crash, no rows
    assert report.config is not None and not any(s["name"].startswith("bad:") for s in report.config.annotation_schemes)


def test_a_machine_rater_writes_each_answer_in_the_shape_its_type_stores_it() -> None:
    from potato_queue.runs.rater import rater_state

    schemes = {
        "better": {"annotation_type": "pairwise", "name": "better"},
        "m:Speed": {"annotation_type": "likert", "name": "m:Speed", "row_of": {"scheme": "m", "row": "Speed"}},
        "mood": {"annotation_type": "radio", "name": "mood"},
    }
    record = {"run_id": "r", "trainer": "sklearn-text", "schemas": list(schemes), "params": {}}
    predictions = [
        {"instance_id": "1", "schema_name": name, "payload": {"label": label}, "confidence": 0.9}
        for name, label in (("better", "B"), ("m:Speed", "High"), ("mood", "calm"))
    ]
    kinds = {"better": "nominal", "m:Speed": "ordinal", "mood": "nominal"}
    state = rater_state(record, predictions, {"1"}, kinds, schemes)
    assert state["instance_id_to_label_to_value"]["1"] == [
        [{"schema": "better", "name": "selection"}, "B"],
        [{"schema": "m", "name": "Speed"}, "High"],
        [{"schema": "mood", "name": "calm"}, "calm"],
    ]
