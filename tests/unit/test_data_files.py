"""Items read as Potato 2.12.1's server reads its data files: every format, Potato's own refusals in our words,
and the keys checked against the items before any run.

Potato is the reference: its server's parser (potato.data_sources.parsing) reads the same files, and its own
build_bundle, fed the items its server reads, writes the same bundle (byte for byte: the same digest).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from potato_queue.bundle import build_bundle
from potato_queue.errors import ConfigError, PotatoQueueError
from potato_queue.validate import check_file, load_checked
from tests.potato_examples import example_project, items_of

pytestmark = pytest.mark.unit

ITEMS = [
    {"id": "007", "text": 'She said "no", then left.'},
    {"id": "2", "text": "Ünïcode, commas, and\ta tab"},
    {"id": "10", "text": "NA"},
    {"id": "x", "text": "1.50"},
]


def _project(root: Path, data_file: str, **config: Any) -> Path:
    (root / "data").mkdir(parents=True, exist_ok=True)
    scheme = {"annotation_type": "radio", "name": "s", "description": "d", "labels": ["a", "b"]}
    data = {
        "task_dir": ".",
        "data_files": [data_file],
        "annotation_schemes": [scheme],
        "model_training": {"enabled": True, "splits": {"train": 0.5, "val": 0.25, "test": 0.25}},
        **config,
    }
    (root / "config.yaml").write_text(yaml.safe_dump(data))
    answers = {item["id"]: [[{"schema": "s", "name": lab}, lab]] for item, lab in zip(ITEMS, "abab", strict=True)}
    (root / "annotation_output" / "ann").mkdir(parents=True, exist_ok=True)
    (root / "annotation_output" / "ann" / "user_state.json").write_text(
        json.dumps({"user_id": "ann", "instance_id_to_label_to_value": answers})
    )
    return root / "config.yaml"


def _write(path: Path, fmt: str, encoding: str = "utf-8") -> None:
    if fmt in ("csv", "tsv"):
        with path.open("w", newline="", encoding=encoding) as fh:
            writer = csv.writer(fh, delimiter="," if fmt == "csv" else "\t", quoting=csv.QUOTE_MINIMAL)
            if fmt == "tsv":
                writer = csv.writer(fh, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar=None)
                fh.write("id\ttext\n" + "".join(f"{i['id']}\t{i['text'].replace(chr(9), ' ')}\n" for i in ITEMS))
                return
            writer.writerow(["id", "text"])
            writer.writerows([i["id"], i["text"]] for i in ITEMS)
    elif fmt == "json":
        path.write_text(json.dumps(ITEMS, indent=2), encoding=encoding)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(i) + "\n" for i in ITEMS), encoding=encoding)
    elif fmt == "parquet":
        import pandas as pd

        pd.DataFrame(ITEMS).to_parquet(path)


def _rows(bundle: Path) -> dict[str, str]:
    return {
        row["instance_id"]: row["text"]
        for name in ("train", "val", "test")
        for row in map(json.loads, (bundle / f"{name}.jsonl").read_text().splitlines())
    }


@pytest.mark.parametrize("fmt", ["csv", "tsv", "json", "jsonl", "parquet"])
def test_every_format_potato_reads_gives_its_items_with_ids_kept_as_written(tmp_path: Path, fmt: str) -> None:
    if fmt == "parquet":
        pytest.importorskip("pyarrow", reason="parquet needs pyarrow (make installs it)")
    config_path = _project(tmp_path / "p", f"data/items.{fmt}")
    _write(tmp_path / "p" / "data" / f"items.{fmt}", fmt)
    manifest = build_bundle(load_checked(config_path), tmp_path / "bundle")
    texts = _rows(tmp_path / "bundle")
    assert set(texts) == {"007", "2", "10", "x"}, "ids as strings, 007 not 7"
    assert texts["10"] == "NA" and texts["x"] == "1.50", "a cell kept verbatim: no NaN, no number"
    assert manifest["stats"]["n_items"] == 4
    if fmt != "tsv":  # TSV has no quoting: its tab became a space above
        assert texts["2"] == ITEMS[1]["text"] and texts["007"] == ITEMS[0]["text"]


def test_a_data_file_in_another_encoding_is_read_with_the_encoding_its_entry_names(tmp_path: Path) -> None:
    config_path = _project(tmp_path / "p", "data/items.csv")
    _write(tmp_path / "p" / "data" / "items.csv", "csv", encoding="latin-1")
    report = check_file(config_path)
    assert any("is not utf-8 text" in e and "encoding: latin-1" in e for e in report.errors), report.errors
    data = yaml.safe_load(config_path.read_text())
    data["data_files"] = [{"path": "data/items.csv", "encoding": "latin-1"}]
    config_path.write_text(yaml.safe_dump(data))
    build_bundle(load_checked(config_path), tmp_path / "bundle")
    assert _rows(tmp_path / "bundle")["2"] == ITEMS[1]["text"]


def test_a_csv_projects_bundle_is_the_one_potato_builds_from_the_items_its_server_reads(tmp_path: Path) -> None:
    """Potato's check-box example (CSV data, a multiselect) with three annotators: Potato's own build_bundle
    over the items Potato's server reads from the CSV gives the same files and digest as ours."""
    from potato.export.cli import build_export_context
    from potato.training.dataset import build_bundle as potatos_build

    config_path = example_project("check-box", tmp_path / "project")
    context = build_export_context(str(config_path))
    assert context.items == {}, "Potato's export reads no CSV rows: its training reads the server's items"
    context.items = items_of(config_path)
    potatos_build(context, str(tmp_path / "potato"), ["favorite_color"])
    ours = build_bundle(load_checked(config_path), tmp_path / "ours", ["favorite_color"])
    theirs = json.loads((tmp_path / "potato" / "manifest.json").read_text())
    assert ours["digest"] == theirs["digest"] and ours["stats"] == theirs["stats"]
    assert ours["stats"]["n_items"] == 120 and ours["stats"]["splits"]["train"] > 50
    for name in ("train.jsonl", "val.jsonl", "test.jsonl", "labels.json"):
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "potato" / name).read_bytes(), name


def _refused(tmp_path: Path, name: str, content: str, **config: Any) -> str:
    config_path = _project(tmp_path / "p", f"data/{name}", **config)
    (tmp_path / "p" / "data" / name).write_text(content)
    errors = check_file(config_path).errors
    assert len(errors) == 1, errors
    with pytest.raises(ConfigError):
        load_checked(config_path)
    return errors[0]


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("items.txt", "id,text\n1,a\n", "is a '.txt' file by its name, and Potato reads only .csv, .tsv, .json"),
        ("items.jsonl", '{"id": "1", "text": "a"}\n{"id": "2", "text": \n', "line 2 is not JSON"),
        ("items.jsonl", '{"id": "1", "text": "a"}\n["x"]\n', "item 2 is list, not an object of fields"),
        (
            "items.json",
            '[{"id": "1", "text": "a"}, {"text": "b"}]',
            "item 2 has no field 'id' (item_properties.id_key)",
        ),
        ("items.csv", "id,text\n1,a\n,b\n", "item 2's 'id' is empty"),
        ("items.csv", "id,text\n1,a\n1,b\n", "two items have the id '1'"),
        ("items.csv", "id,text\n1,a,extra\n", "the row at line 2 has 3 cells and the header has 2"),
    ],
    ids=["extension", "bad-json-line", "not-an-object", "no-id", "empty-id", "duplicate-id", "extra-cells"],
)
def test_a_data_file_potato_would_refuse_is_refused_by_validate_with_the_fix(
    tmp_path: Path, name: str, content: str, said: str
) -> None:
    error = _refused(tmp_path, name, content)
    assert said in error and "; fix: " in error, error


def test_a_wrong_id_key_names_the_fields_the_items_have(tmp_path: Path) -> None:
    error = _refused(tmp_path, "items.csv", "ident,text\n1,a\n", item_properties={"id_key": "id", "text_key": "text"})
    assert "item 1 has no field 'id'" in error and "its fields are ident, text" in error, error
    assert "set item_properties.id_key to the field that holds each item's id (one of ident, text)" in error


def test_a_text_key_no_item_has_is_an_error_naming_the_key_the_file_and_the_fields(tmp_path: Path) -> None:
    error = _refused(tmp_path, "items.csv", "id,sentence\n1,a\n2,b\n", item_properties={"text_key": "text"})
    assert error == (
        "item_properties.text_key is 'text', and no item of the data files has that field (the first item of "
        "data/items.csv has id, sentence): every run would train on empty texts; set item_properties.text_key to "
        "the field that holds the text"
    )


def test_mostly_empty_texts_warn_and_all_empty_texts_refuse_the_bundle_before_a_trainer(tmp_path: Path) -> None:
    config_path = _project(tmp_path / "p", "data/items.csv")
    (tmp_path / "p" / "data" / "items.csv").write_text("id,text\n007,\n2,\n10,\nx,word\n")
    report = check_file(config_path)
    assert report.errors == [] and any("3 of 4 items have an empty 'text'" in w for w in report.warnings)
    (tmp_path / "p" / "data" / "items.csv").write_text("id,text\n007,\n2,\n10,\nx, \n")
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "manifest.json").write_text("{}")
    with pytest.raises(PotatoQueueError) as refused:
        build_bundle(load_checked(config_path), tmp_path / "bundle")
    assert refused.value.message == (
        "all 4 labelled items have an empty 'text' (item_properties.text_key) and no media: a run would learn from nothing"
    )
    assert (tmp_path / "bundle" / "manifest.json").read_text() == "{}", "the bundle there before is untouched"


def test_an_id_on_items_of_two_data_files_is_refused_naming_both(tmp_path: Path) -> None:
    config_path = _project(tmp_path / "p", "data/a.jsonl", data_files=["data/a.jsonl", "data/b.csv"])
    (tmp_path / "p" / "data" / "a.jsonl").write_text('{"id": "1", "text": "a"}\n{"id": "7", "text": "b"}\n')
    (tmp_path / "p" / "data" / "b.csv").write_text("id,text\n3,c\n7,d\n")
    (error,) = check_file(config_path).errors
    data = tmp_path / "p" / "data"
    assert error.startswith(
        f"two items have the id '7': {data / 'a.jsonl'} item 2 and {data / 'b.csv'} item 2, and Potato refuses"
    ), error


def test_pairs_under_their_own_field_need_no_text_field(tmp_path: Path) -> None:
    root = tmp_path / "p"
    (root / "data").mkdir(parents=True)
    (root / "data" / "pairs.jsonl").write_text(
        '{"id": "1", "responses": ["a", "b"]}\n{"id": "2", "responses": ["c", "d"]}\n'
    )
    scheme = {"annotation_type": "pairwise", "name": "better", "description": "d", "items_key": "responses"}
    config = {"task_dir": ".", "data_files": ["data/pairs.jsonl"], "annotation_schemes": [scheme]}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    assert check_file(root / "config.yaml").errors == []
