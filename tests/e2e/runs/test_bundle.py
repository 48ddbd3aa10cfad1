"""bundle.py against bundles Potato 2.12.1 wrote itself (tests/fixtures/two_annotators_potato_bundle)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from potato_queue.bundle import build_bundle, pack_bundle, schema_kind, split_of, target_schemas
from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.validate import load_checked
from tests.conftest import ROOT, run_cli

FIXTURE = ROOT / "tests" / "fixtures" / "two_annotators"
GOLDEN = ROOT / "tests" / "fixtures" / "two_annotators_potato_bundle"
SPLIT_FILES = ["train.jsonl", "val.jsonl", "test.jsonl", "unlabeled.jsonl"]
SCHEMAS = ["sentiment", "topics", "quality", "intensity", "highlight"]


def project_copy(tmp_path: Path, variant: str = "") -> Path:
    """The fixture project, as golden/<variant> was made from it (see the golden README)."""
    root = tmp_path / "project"
    shutil.copytree(FIXTURE, root)
    config = root / "config.yaml"
    if variant == "majority":
        config.write_text(config.read_text().replace("  split_seed: 8\n", "  split_seed: 8\n  aggregation: majority\n"))
    if variant == "one_annotator":
        shutil.rmtree(root / "annotation_output" / "bob")
        shutil.rmtree(root / "annotation_output" / "carol")
    return config


def load(config: Path) -> ProjectConfig:
    return load_checked(config)


def bundle_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("variant", ["", "majority", "one_annotator"], ids=["consensus", "majority", "one_annotator"])
def test_bundle_is_potatos_byte_for_byte(tmp_path: Path, variant: str) -> None:
    config = project_copy(tmp_path, variant) if variant else FIXTURE / "config.yaml"
    golden = GOLDEN / variant if variant else GOLDEN
    out = tmp_path / "bundle"
    manifest = build_bundle(load(config), out)
    for name in [*SPLIT_FILES, "labels.json", "manifest.json"]:
        assert (out / name).read_bytes() == (golden / name).read_bytes(), f"{name} differs from Potato's"
    expected = json.loads((golden / "manifest.json").read_text())
    assert manifest == expected
    for key in ["digest", "splits", "stats"]:
        assert manifest[key] == expected[key], key
    assert [s["name"] for s in manifest["schemas"]] == SCHEMAS  # the textbox gives no target
    assert manifest["splits"]["unlabeled"]["predict_only"] is True


def test_golden_bundles_tell_the_aggregations_apart() -> None:
    """Otherwise the byte-for-byte test could not catch a consensus built as a majority vote."""
    train = {v: (GOLDEN / v / "train.jsonl").read_bytes() for v in ["", "majority", "one_annotator"]}
    assert len(set(train.values())) == 3


def test_one_annotator_takes_the_majority_path(tmp_path: Path) -> None:
    manifest = build_bundle(load(project_copy(tmp_path, "one_annotator")), tmp_path / "bundle")
    rows = {r["instance_id"]: r for f in SPLIT_FILES[:3] for r in map(json.loads, (tmp_path / "bundle" / f).open())}
    assert manifest["aggregation"] == "consensus"  # the setting is recorded; one annotator cannot run Dawid-Skene
    assert rows["r04"]["targets"]["topics"] == ["plot", "acting"]  # alice's own order
    assert rows["r06"]["targets"]["sentiment"] == "positive"  # alice's answer; bob and carol disagreed
    assert "r22" not in rows and manifest["stats"]["n_skipped_no_label"] == 1  # answered only in a textbox


def independent_split(instance_id: str, seed: int, bands: list[tuple[str, float]]) -> str:
    fraction = int(hashlib.sha256(f"{seed}:{instance_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    total, upper = sum(f for _, f in bands), 0.0
    for name, share in bands:
        upper += share / total
        if fraction <= upper:
            return name
    return bands[-1][0]


def test_split_formula() -> None:
    defaults = {"train": 0.7, "val": 0.15, "test": 0.15}
    for iid in ["r01", "r13", "r20", "item_7", "42", "ünï"]:
        for seed in (0, 8):
            assert split_of(iid, defaults, seed) == independent_split(iid, seed, list(defaults.items()))
        assert split_of(iid, {"a": 2, "b": 2}, 1) == independent_split(iid, 1, [("a", 0.5), ("b", 0.5)])
    # Every row of Potato's bundle sits in the split the formula gives, rows in sorted id order.
    for name in ["train", "val", "test"]:
        ids = [json.loads(line)["instance_id"] for line in (GOLDEN / f"{name}.jsonl").open()]
        assert ids == sorted(ids) and ids
        assert {independent_split(i, 8, list(defaults.items())) for i in ids} == {name}


def test_schema_kinds() -> None:
    kinds = {
        t: schema_kind({"annotation_type": t})
        for t in [
            "radio",
            "select",
            "multiselect",
            "likert",
            "slider",
            "number",
            "span",
            "textbox",
            "pure_display",
            "nope",
        ]
    }
    assert kinds == {
        "radio": "nominal",
        "select": "nominal",
        "multiselect": "multilabel",
        "likert": "ordinal",
        "slider": "continuous",
        "number": "continuous",
        "span": "span",
        "textbox": "text",
        "pure_display": "unsupported",
        "nope": "unsupported",
    }
    assert schema_kind({"annotation_type": "multiselect", "max_choices": 1}) == "nominal"
    assert target_schemas(load(FIXTURE / "config.yaml")) == SCHEMAS


def test_linked_media(tmp_path: Path) -> None:
    """A media file that exists is symlinked under a folder named by a hash of its path, as Potato does."""
    config = project_copy(tmp_path)
    poster = config.parent / "images" / "missing_poster.png"
    poster.parent.mkdir()
    poster.write_bytes(b"\x89PNG fake")
    out = tmp_path / "bundle"
    manifest = build_bundle(load(config), out)
    rows = {r["instance_id"]: r for f in SPLIT_FILES for r in map(json.loads, (out / f).open())}
    expected = f"{hashlib.sha1(os.path.abspath(poster).encode()).hexdigest()[:2]}/missing_poster.png"
    assert rows["r08"]["media"] == expected and "media_missing" not in rows["r08"]
    assert (out / "media" / expected).resolve() == poster.resolve()
    assert rows["r24"]["media_missing"] == "images/missing_still.jpg"
    assert rows["r03"]["media"] == "https://example.org/posters/r03.jpg"
    assert (manifest["stats"]["n_media_linked"], manifest["stats"]["n_media_missing"]) == (1, 1)


def test_pack_is_deterministic_and_extracts_to_the_bundle(tmp_path: Path) -> None:
    config = project_copy(tmp_path)
    (config.parent / "images").mkdir()
    (config.parent / "images" / "missing_poster.png").write_bytes(b"poster bytes")
    first, second = tmp_path / "one", tmp_path / "two"
    build_bundle(load(config), first)
    packed = pack_bundle(first, tmp_path / "a.tar.gz")
    os.utime(first / "train.jsonl", (1, 1))  # a later mtime must not change the archive
    build_bundle(load(config), second)
    assert pack_bundle(first, tmp_path / "b.tar.gz") == packed == pack_bundle(second, tmp_path / "c.tar.gz")
    data = (tmp_path / "a.tar.gz").read_bytes()
    assert packed == (len(data), hashlib.sha256(data).hexdigest())
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == sorted(m.name for m in members)
        assert {(m.mtime, m.uid, m.gid) for m in members} == {(0, 0, 0)}
        assert "train.jsonl" in [m.name for m in members] and not any(m.issym() for m in members)
        tar.extractall(tmp_path / "extracted", filter="data")
    extracted = bundle_files(tmp_path / "extracted")
    assert extracted == bundle_files(first)  # media links arrive as the files they point at
    assert extracted[next(n for n in extracted if n.startswith("media/"))] == b"poster bytes"


def test_cli_training_bundle(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli("training", "bundle", FIXTURE / "config.yaml", "--out", out)
    assert proc.returncode == 0, proc.stderr
    digest = json.loads((GOLDEN / "manifest.json").read_text())["digest"]
    assert "train 13, val 4, test 4, unlabeled 5" in proc.stdout and digest in proc.stdout
    assert (out / "train.jsonl").read_bytes() == (GOLDEN / "train.jsonl").read_bytes()
    again = run_cli("training", "bundle", FIXTURE / "config.yaml", "--out", out, "--schema", "sentiment")
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "labels.json").read_text()) == {"sentiment": ["negative", "neutral", "positive"]}


def test_cli_refuses_a_project_without_labels(tmp_path: Path) -> None:
    config = project_copy(tmp_path)
    for user in ["alice", "bob", "carol"]:
        shutil.rmtree(config.parent / "annotation_output" / user)
    proc = run_cli("training", "bundle", config, "--out", tmp_path / "out")
    assert proc.returncode == 1
    assert "error: no labelled items to train on" in proc.stderr and "fix: label some items" in proc.stderr


def test_missing_data_file_is_a_clear_error(tmp_path: Path) -> None:
    config = project_copy(tmp_path)
    project = load(config)
    (config.parent / "data" / "more.json").unlink()
    with pytest.raises(PotatoQueueError) as caught:
        build_bundle(project, tmp_path / "out")
    assert "more.json does not exist" in caught.value.message and "data_files" in (caught.value.fix or "")
    assert not (tmp_path / "out").exists()


def test_out_dir_that_is_not_a_bundle_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(PotatoQueueError, match="not empty and holds no bundle"):
        build_bundle(load(FIXTURE / "config.yaml"), tmp_path / "out")
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_rebuild_replaces_a_previous_bundle(tmp_path: Path) -> None:
    out = tmp_path / "out"
    build_bundle(load(FIXTURE / "config.yaml"), out)
    config = project_copy(tmp_path)
    config.write_text(config.read_text().replace("include_unlabeled: true", "include_unlabeled: false"))
    manifest = build_bundle(load(config), out)
    assert "unlabeled" not in manifest["splits"] and not (out / "unlabeled.jsonl").exists()


def test_the_readmes_example_project_bundles_as_potato_bundles_it(tmp_path: Path) -> None:
    """examples/reviews (440 reviews, two annotators who disagree on some): Potato 2.12.1's own builder
    wrote tests/fixtures/reviews_potato_bundle; ours gives the same digest, splits and labels."""
    out = tmp_path / "bundle"
    manifest = build_bundle(load(ROOT / "examples" / "reviews" / "config.yaml"), out)
    potatos = json.loads((ROOT / "tests" / "fixtures" / "reviews_potato_bundle" / "manifest.json").read_text())
    for key in ["digest", "splits", "stats", "labels"]:
        assert manifest[key] == potatos[key], key
    assert (out / "labels.json").read_bytes() == (
        ROOT / "tests/fixtures/reviews_potato_bundle/labels.json"
    ).read_bytes()
    assert sum(manifest["stats"]["splits"].values()) == 360 and manifest["splits"]["unlabeled"]["n"] == 80
