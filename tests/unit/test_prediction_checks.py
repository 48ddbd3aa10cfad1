"""Every kind's predictions checked before they are stored or scored (runs/gate.py refusals with
runs/checks.py): what a hostile or broken host sent in the wild (issue 51's cases), against a real bundle
of the two-annotators fixture (a radio, a multiselect, a likert, a 0..100 slider and a span scheme)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from potato_queue.bundle import build_bundle
from potato_queue.runs.checks import MAX_SPANS_PER_ITEM
from potato_queue.runs.gate import refusals
from potato_queue.validate import load_checked
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

FIXTURE = ROOT / "tests" / "fixtures" / "two_annotators" / "config.yaml"
SCHEMAS = ["sentiment", "topics", "quality", "intensity", "highlight"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    out = tmp_path_factory.mktemp("bundle") / "b"
    build_bundle(load_checked(FIXTURE), out, SCHEMAS)
    row = json.loads((out / "val.jsonl").read_text().splitlines()[0])
    return out, row["instance_id"], len(row["text"])


def _said(bundle: tuple[Path, str, int], schema: str, payload: Any, confidence: Any = None) -> str | None:
    folder, iid, _ = bundle
    p = {"instance_id": iid, "schema_name": schema, "payload": payload, "confidence": confidence}
    valid, refused = refusals(load_checked(FIXTURE), folder, [p], SCHEMAS)
    return refused[0].why if refused else None


def test_a_slider_value_is_a_finite_number_inside_its_bounds(bundle: tuple[Path, str, int]) -> None:
    assert _said(bundle, "intensity", 42) is None
    assert _said(bundle, "intensity", 1e308) == "value 1e+308 is outside the scale's 0..100"
    assert _said(bundle, "intensity", -500) == "value -500 is outside the scale's 0..100"
    assert _said(bundle, "intensity", "<script>alert(1)</script>") == (
        "value '<script>alert(1)</script>' is not a finite number"
    )
    assert _said(bundle, "intensity", True) == "value True is not a finite number"


def test_a_likert_value_is_one_of_its_points(bundle: tuple[Path, str, int]) -> None:
    assert _said(bundle, "quality", {"label": 4, "confidence": 0.7}, 0.7) is None
    said = _said(bundle, "quality", {"label": "NOT-A-VERDICT", "confidence": 0.7}, 0.7)
    assert said == "value 'NOT-A-VERDICT' is not one of the scale's points (1, 2, 3, 4, 5)"
    assert _said(bundle, "quality", {"label": 9, "confidence": 0.7}, 0.7) is not None


def test_spans_are_whole_offsets_inside_the_text_with_a_label_of_the_scheme_each_once(
    bundle: tuple[Path, str, int],
) -> None:
    length = bundle[2]

    def span(start: Any, end: Any, label: str = "praise") -> dict[str, Any]:
        return {"start": start, "end": end, "label": label, "confidence": 0.9}

    assert _said(bundle, "highlight", [span(0, 3)]) is None
    assert _said(bundle, "highlight", [span(5, 2)]) == f"span 5..2 is not inside the item's text (0..{length})"
    assert (
        _said(bundle, "highlight", [span(0, 10**9)]) == f"span 0..{10**9} is not inside the item's text (0..{length})"
    )
    assert _said(bundle, "highlight", [span(0.5, 3)]) == "span offsets 0.5..3 are not whole numbers"
    assert _said(bundle, "highlight", [span(0, 3, "evil")]).startswith("span label 'evil' is not one of the schema's")
    assert _said(bundle, "highlight", [span(0, 3), span(0, 3)]) == "span 0..3 'praise' is given twice"
    flood = [span(0, 3)] * 100_000
    assert _said(bundle, "highlight", flood) == f"100000 entries for one item; at most {MAX_SPANS_PER_ITEM} are taken"


def test_a_set_names_each_label_once_and_no_more_labels_than_the_scheme_has(bundle: tuple[Path, str, int]) -> None:
    def entries(*labels: str) -> list[dict[str, Any]]:
        return [{"label": label, "confidence": 0.8} for label in labels]

    assert _said(bundle, "topics", entries("plot", "acting")) is None
    assert _said(bundle, "topics", entries("plot", "plot")) == "a label is given twice in the set"
    assert _said(bundle, "topics", entries(*["acting"] * 200_000)).startswith("200000 entries for one item")
