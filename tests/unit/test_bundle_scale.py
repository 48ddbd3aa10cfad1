"""A large project's bundle: the vectorised Dawid-Skene against Potato's own, and the bundle reused by the digest of
its inputs (a real run store on a real Redis; the job builder an executor runs)."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from potato_queue.bundle.dawid_skene import dawid_skene
from potato_queue.bundle.inputs import inputs_digest
from potato_queue.errors import PotatoQueueError
from potato_queue.run import RunRecord, RunState
from potato_queue.runs.job import build_job
from potato_queue.store import RunStore
from potato_queue.validate import load_checked
from tests.lifecycle_helpers import make_project

pytestmark = pytest.mark.unit

Observation = tuple[str, str, str]


def _crowd(seed: int, n_items: int, n_workers: int, classes: list[str], cover: float) -> list[Observation]:
    """Workers of mixed care, each on a share of the items, in the order Potato's bundle lists them (by worker,
    then item)."""
    rng = random.Random(seed)
    truth = {f"i{n:05d}": rng.choice(classes) for n in range(n_items)}
    care = [rng.uniform(0.3, 0.95) for _ in range(n_workers)]
    out = []
    for w in range(n_workers):
        for item, label in truth.items():
            if rng.random() < cover:
                out.append((f"w{w}", item, label if rng.random() < care[w] else rng.choice(classes)))
    return out


CROWDS = {
    "three classes, five workers": _crowd(1, 3000, 5, ["neg", "neu", "pos"], 0.5),
    "a 5-point scale, sparse": _crowd(2, 2000, 7, ["1", "2", "3", "4", "5"], 0.25),
    "two classes, two workers (many exact ties)": _crowd(3, 1500, 2, ["a", "b"], 0.9),
    "one class": _crowd(4, 50, 3, ["only"], 0.8),
    # items in no sorted order, a worker who meets one class only, one item seen once
    "unsorted and lopsided": [
        ("bob", "z9", "x"),
        ("amy", "a1", "y"),
        ("bob", "a1", "x"),
        ("cat", "m5", "y"),
        ("amy", "m5", "y"),
        ("cat", "z9", "x"),
        ("amy", "q", "x"),
    ],
}


@pytest.mark.parametrize("name", list(CROWDS))
def test_dawid_skene_gives_potatos_labels_to_the_last_item(name: str) -> None:
    from potato.server_utils.consensus import dawid_skene as potatos

    observations = CROWDS[name]
    ours, theirs = dawid_skene(observations), potatos(observations).labels
    assert list(ours) == sorted(theirs) and ours == theirs


# ---------------------------------------------------------------- the bundle's inputs and its reuse


def _project(tmp_path: Path) -> Path:
    return make_project(tmp_path)


def _digest(config_path: Path, schemas: list[str] | None = None) -> str:
    return inputs_digest(load_checked(config_path), schemas or ["sentiment"])


def _edit_config(config_path: Path, change: Any) -> None:
    data = yaml.safe_load(config_path.read_text())
    change(data)
    config_path.write_text(yaml.safe_dump(data, sort_keys=False))


def _edit_json(path: Path, change: Any) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _set(mapping: dict[str, Any], key: str, value: Any) -> None:
    mapping[key] = value


CHANGES = {
    "a data file's item": lambda p: _edit_json(
        p.parent / "data" / "reviews.json", lambda items: _set(items[0], "text", "A different review.")
    ),
    "an annotator's answer": lambda p: _edit_json(
        p.parent / "annotation_output" / "alice" / "user_state.json",
        lambda s: _set(
            s["instance_id_to_label_to_value"], "r001", [[{"schema": "sentiment", "name": "negative"}, "negative"]]
        ),
    ),
    "a new annotator": lambda p: shutil.copytree(
        p.parent / "annotation_output" / "bob", p.parent / "annotation_output" / "dan"
    ),
    "the split seed": lambda p: _edit_config(p, lambda c: _set(c["model_training"], "split_seed", 7)),
    "the splits": lambda p: _edit_config(
        p, lambda c: _set(c["model_training"], "splits", {"train": 0.8, "val": 0.1, "test": 0.1})
    ),
    "the aggregation": lambda p: _edit_config(p, lambda c: _set(c["model_training"], "aggregation", "majority")),
    "a scheme's labels": lambda p: _edit_config(p, lambda c: c["annotation_schemes"][0]["labels"].append("mixed")),
    "the text key": lambda p: _edit_config(p, lambda c: _set(c["item_properties"], "text_key", "id")),
    "include_unlabeled": lambda p: _edit_config(
        p, lambda c: _set(c["model_training"]["writeback"], "include_unlabeled", False)
    ),
    "a media file": lambda p: (p.parent / "media").mkdir() or (p.parent / "media" / "cat.png").write_bytes(b"png"),
}


@pytest.mark.parametrize("what", list(CHANGES))
def test_any_change_of_what_the_bundle_reads_misses_the_cache(tmp_path: Path, what: str) -> None:
    config = _project(tmp_path)
    before = _digest(config)
    assert _digest(config) == before, "the same inputs, the same digest"
    CHANGES[what](config)
    assert _digest(config) != before, what


def test_what_the_bundle_does_not_read_keeps_the_digest(tmp_path: Path) -> None:
    config = _project(tmp_path)
    before = _digest(config)
    _edit_config(config, lambda c: _set(c["model_training"], "max_wall_seconds", 60))
    (config.parent / "notes.txt").write_text("the admin's own file")
    assert _digest(config) == before
    assert _digest(config, ["sentiment"]) != inputs_digest(load_checked(config), None), "the schemes a run trains"


def _job_of_new_run(store: RunStore) -> tuple[RunRecord, str]:
    record = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")
    held = store.transition(record["run_id"], RunState.STARTING, record)
    assert held is not None
    paths = store.paths(record["run_id"])
    build_job(store.config, store, held, paths)
    return held, paths.run_log.read_text()


def test_a_run_on_unchanged_data_reuses_the_last_bundle_and_says_so(tmp_path: Path, redis_server_url: str) -> None:
    config_path = _project(tmp_path)
    store = RunStore(load_checked(config_path), redis.Redis.from_url(redis_server_url))
    first, first_log = _job_of_new_run(store)
    assert "bundle built" in first_log
    second, second_log = _job_of_new_run(store)
    assert (
        f"bundle of run {first['run_id']} reused (its data files, annotations, config and split seed are "
        f"unchanged: inputs sha256 " in second_log
    ), second_log
    a, b = store.paths(first["run_id"]), store.paths(second["run_id"])
    assert b.bundle.read_bytes() == a.bundle.read_bytes()
    assert (b.bundle_dir / "train.jsonl").read_bytes() == (a.bundle_dir / "train.jsonl").read_bytes()
    # an annotation changes: the next run builds its own
    CHANGES["an annotator's answer"](config_path)
    third, third_log = _job_of_new_run(RunStore(load_checked(config_path), store.redis))
    assert "bundle built" in third_log and "reused" not in third_log
    # the reused run's files pruned meanwhile (retain_runs): built again, not failed
    for path in (store.paths(third["run_id"]).bundle, store.paths(third["run_id"]).bundle_dir):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    _, fourth_log = _job_of_new_run(RunStore(load_checked(config_path), store.redis))
    assert "bundle built" in fourth_log


# ---------------------------------------------------------------- a large project, read on two cores


def _awkward_project(folder: Path, seed: int = 5, n_items: int = 1500) -> Path:
    """Annotators as users have them: six folders (two under one user id, one with no user_state.json's user_id),
    a radio scheme and a multiselect whose answers list the same labels in different orders, answers to items
    not in the data file, empty answers, and an answer in Potato's older dict encoding."""
    rng = random.Random(seed)
    (folder / "data").mkdir(parents=True)
    with (folder / "data" / "items.jsonl").open("w") as fh:
        for n in range(n_items):
            fh.write(json.dumps({"id": f"i{n:05d}", "text": f"item {n} é {rng.random():.3f}"}) + "\n")
    users = ["ann", "bob", "cat", "dan", "ann", "eve"]
    for folder_n, user in enumerate(users):
        labels: dict[str, Any] = {}
        for n in range(n_items + 40):  # the last 40 are in no data file
            if rng.random() < 0.45:
                tags = rng.sample(["x", "y", "z"], rng.randint(1, 3))
                said = rng.choice(["pos", "neg", "neu"])
                # ann's second folder answers some items in tags alone: its record replaces the first's whole
                answer = [] if folder_n == 4 and rng.random() < 0.3 else [[{"schema": "sentiment", "name": said}, said]]
                labels[f"i{n:05d}"] = answer + [[{"schema": "tags", "name": t}, "true"] for t in tags]
        labels["i00003"], labels["i00004"] = [], {"sentiment": {"pos": "pos"}}
        state: dict[str, Any] = {"instance_id_to_label_to_value": labels}
        if folder_n != 5:
            state["user_id"] = user
        (folder / "annotation_output" / f"u{folder_n}").mkdir(parents=True)
        (folder / "annotation_output" / f"u{folder_n}" / "user_state.json").write_text(json.dumps(state))
    (folder / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "annotation_task_name": "awkward",
                "task_dir": ".",
                "data_files": ["data/items.jsonl"],
                "item_properties": {"id_key": "id", "text_key": "text"},
                "output_annotation_dir": "annotation_output",
                "annotation_schemes": [
                    {
                        "annotation_type": "radio",
                        "name": "sentiment",
                        "description": "s",
                        "labels": ["pos", "neg", "neu"],
                    },
                    {"annotation_type": "multiselect", "name": "tags", "description": "t", "labels": ["x", "y", "z"]},
                ],
                "model_training": {"enabled": True, "writeback": {"schemas": ["sentiment"], "include_unlabeled": True}},
            }
        )
    )
    return folder / "config.yaml"


def _bundle_files(folder: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(folder.iterdir())
        if p.suffix in (".jsonl", ".json") and p.name != "manifest.json"
    }


@pytest.mark.parametrize("schemas", [["sentiment"], ["tags"], ["sentiment", "tags"]])
def test_a_project_read_on_two_cores_gives_potatos_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schemas: list[str]
) -> None:
    """The annotators' files read by a forked child (forced here for a small project) and in this process give
    the bundle Potato 2.12.1's own build_bundle writes, byte for byte."""
    from potato.export.cli import build_export_context
    from potato.training.dataset import build_bundle as potatos_build

    from potato_queue.bundle import annotations, build_bundle

    config_path = _awkward_project(tmp_path / "project")
    potatos_build(build_export_context(str(config_path)), str(tmp_path / "potato"), schemas, include_unlabeled=True)
    built = {}
    for way, from_bytes in (("inline", 10**15), ("forked", 0)):
        monkeypatch.setattr(annotations, "PARALLEL_FROM_BYTES", from_bytes)
        manifest = build_bundle(load_checked(config_path), tmp_path / way, schemas)
        built[way] = _bundle_files(tmp_path / way)
        potatos = json.loads((tmp_path / "potato" / "manifest.json").read_text())
        assert manifest["digest"] == potatos["digest"] and manifest["stats"] == potatos["stats"], way
    assert built["forked"] == built["inline"] == _bundle_files(tmp_path / "potato")


def _children() -> set[int]:
    me = str(os.getpid())
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == me:
            found.add(int(status.parent.name))
    return found


def test_an_unreadable_annotator_file_read_on_the_second_core_is_the_same_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from potato_queue.bundle import annotations, build_bundle

    config_path = _awkward_project(tmp_path / "project", n_items=200)
    (config_path.parent / "annotation_output" / "u0" / "user_state.json").write_text('{"instance_id_to_label')
    before = _children()
    said = {}
    for way, from_bytes in (("inline", 10**15), ("forked", 0)):
        monkeypatch.setattr(annotations, "PARALLEL_FROM_BYTES", from_bytes)
        with pytest.raises(PotatoQueueError) as caught:
            build_bundle(load_checked(config_path), tmp_path / way, ["sentiment"])
        said[way] = caught.value.format()
    assert said["forked"] == said["inline"]
    assert "u0/user_state.json cannot be read as JSON" in said["forked"] and "fix: restore it" in said["forked"]
    assert _children() == before, "no reading process left behind"


def test_the_fast_stopping_rule_stops_where_potatos_exact_one_stops() -> None:
    """numpy's log decides whether EM has converged only where it cannot tip the answer: log-likelihood changes
    set right at the tolerance, where numpy's and math's logs could disagree, get the exact answer."""
    import numpy as np

    from potato_queue.bundle.dawid_skene import _converged, _Likelihood

    rng = np.random.default_rng(7)
    decided_fast = 0
    for trial in range(300):
        before = rng.uniform(1e-4, 1.0, size=int(rng.integers(1, 5000)))
        after = before * (1 + rng.normal(0, 1e-9, size=len(before)))
        now, previous = _Likelihood(after), _Likelihood(before)
        exact_change = abs(now.exact - previous.exact)
        # a tolerance at the exact change, a hair either side of it, or far from it
        tol = exact_change * float(rng.choice([1.0, 1 + 1e-15, 1 - 1e-15, 1 + 1e-9, 0.5, 2.0]))
        fresh_now, fresh_previous = _Likelihood(after), _Likelihood(before)
        assert _converged(fresh_now, fresh_previous, tol) == (exact_change < tol), trial
        decided_fast += fresh_now._exact is None
    assert 0 < decided_fast < 300, "both ways of deciding were taken"
