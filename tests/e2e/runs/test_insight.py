"""The model as the annotation team's tool, on the README's example project (examples/reviews: 440 reviews, 80
unlabelled), through the real queue (Redis, server, executor, worker): what to label next and Potato 2.12.1
serving it, a learning curve, the quality report, two runs compared (the API and the CLI)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from statistics import median
from typing import Any

import pytest

from potato_queue.insight.next_items import NEAR_DUPLICATE_COSINE, cosine, tfidf_vectors
from potato_queue.insight.potato_order import POTATO_ORDER_KEYS, PRIORITY_FIELD
from tests.conftest import ROOT, run_cli
from tests.lifecycle_helpers import TERMINAL, Services, make_project, run_paths
from tests.potato_helpers import PotatoAnnotator, PotatoServer, add_potato_keys

EXAMPLE = ROOT / "examples" / "reviews"


@dataclass
class Project:
    svc: Services
    config: Path
    curve_run: str  # sklearn-text with a learning curve
    baseline_run: str  # majority-baseline

    def api(self, path: str, method: str = "GET") -> tuple[int, Any]:
        return self.svc.api(method, path)

    def cli(self, *args: str) -> Any:
        return run_cli("training", *args, env={"POTATO_QUEUE_REDIS_URL": self.svc.redis_url}, timeout_s=120)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, redis_server_url: str) -> Iterator[Project]:
    tmp = tmp_path_factory.mktemp("insight")
    config = make_project(tmp, source=EXAMPLE)
    add_potato_keys(config, **POTATO_ORDER_KEYS)
    svc = Services(config, redis_server_url, tmp)
    try:
        svc.serve()
        svc.executor()
        curve = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], params={"learning_curve": True})
        baseline = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
        for run_id in (curve, baseline):
            assert svc.wait_for(run_id, TERMINAL, timeout_s=180)["state"] == "succeeded", svc.logs()
        yield Project(svc, config, curve, baseline)
    finally:
        svc.stop()


def test_what_to_label_next_is_the_unsure_first_never_near_copies_and_the_same_every_time(project: Project) -> None:
    status, found = project.api(f"/runs/{project.curve_run}/next?limit=80")
    assert status == 200, found
    assert found["total"] == 80 and len(found["items"]) == 80, "every unlabelled item of the example, ranked"
    assert project.api(f"/runs/{project.curve_run}/next?limit=80")[1] == found, "the same ranking every time"
    items = found["items"]
    # the top is uncertain: the first ten are all above the median uncertainty of the unlabelled items
    middle = median(i["uncertainty"] for i in items)
    assert all(i["uncertainty"] >= middle for i in items[:10]), [i["uncertainty"] for i in items[:10]]
    taken = [i for i in items if i["near_copy_of"] is None]
    assert [i["uncertainty"] for i in taken] == sorted((i["uncertainty"] for i in taken), reverse=True)
    # the run's own texts, from its bundle: no two of the top ten are near-copies by the ranking's measure
    texts = {
        json.loads(line)["instance_id"]: json.loads(line)["text"]
        for line in (run_paths(project.svc, project.curve_run).bundle_dir / "unlabeled.jsonl").read_text().splitlines()
    }
    vectors = tfidf_vectors({i["instance_id"]: texts[i["instance_id"]] for i in items})
    top = [i["instance_id"] for i in items[:10]]
    assert all(cosine(vectors[a], vectors[b]) < NEAR_DUPLICATE_COSINE for a, b in combinations(top, 2))
    predicted = [
        json.loads(line) for line in run_paths(project.svc, project.curve_run).predictions.read_text().splitlines()
    ]
    margins = {
        p["instance_id"]: 1 - (sorted(p["scores"].values())[-1] - sorted(p["scores"].values())[-2]) for p in predicted
    }
    assert all(abs(margins[i["instance_id"]] - i["uncertainty"]) < 1e-3 for i in items), "the run's own margins"


def test_a_fresh_annotator_in_potato_gets_the_top_of_the_list_first(project: Project, tmp_path: Path) -> None:
    done = project.cli("next", project.curve_run, str(project.config), "--to-potato", "--limit", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "restart Potato: it reads the order when it loads its items" in done.stdout
    assert "warning" not in done.stdout, "the project has Potato's priority keys"
    top = [i["instance_id"] for i in project.api(f"/runs/{project.curve_run}/next?limit=5")[1]["items"]]
    assert top[0] in done.stdout and top[4] in done.stdout
    data = json.loads((project.config.parent / "data" / "reviews.json").read_text())
    assert max(data, key=lambda item: item.get(PRIORITY_FIELD, 0))["id"] == top[0]
    potato = PotatoServer(project.config, tmp_path, "unused")
    try:
        potato.start()
        served = PotatoAnnotator(potato.url, "fresh").first_items(5, {"sentiment:::positive": "true"})
    finally:
        potato.stop()
    assert served == top, (served, top)


def test_the_learning_curve_has_four_nested_fits_and_says_the_gain(project: Project) -> None:
    status, found = project.api(f"/runs/{project.curve_run}/curve")
    assert status == 200, found
    curve = found["schemas"]["sentiment"]
    points = curve["points"]
    assert [p["percent"] for p in points] == [25, 50, 75, 100]
    assert [p["n_train"] for p in points] == sorted(p["n_train"] for p in points) and points[0]["n_train"] > 0
    run = project.api(f"/runs/{project.curve_run}")[1]
    assert points[-1]["test_macro_f1"] == run["held_out"]["sentiment"]["test"]["macro_f1"], "100 % is the run's model"
    assert curve["said"].startswith("the last 25 % of the train items (")
    assert "macro-F1" in curve["said"] and "labelled items would add about" in curve["said"]
    status, refused = project.api(f"/runs/{project.baseline_run}/curve")
    assert (
        status == 409
        and "has no learning curve (it was not started with params.learning_curve: true)" in refused["detail"]
    ), refused


def test_the_quality_report_and_the_min_confidence_for_a_precision(project: Project) -> None:
    status, found = project.api(f"/runs/{project.curve_run}/quality?target_precision=0.8")
    assert status == 200, found
    report = found["schemas"]["sentiment"]
    n_held_out = sum(
        project.api(f"/runs/{project.curve_run}")[1]["held_out"]["sentiment"][s]["n"] for s in ("val", "test")
    )
    assert report["n"] == n_held_out == sum(b["n"] for b in report["reliability"]["bins"])
    assert {r["label"] for r in report["per_label"]} >= {"positive", "negative"}
    threshold = report["threshold"]
    if threshold["min_confidence"] is not None:
        assert threshold["precision"] >= 0.8 and 0 < threshold["kept"] <= threshold["of"] == n_held_out
    looser = project.api(f"/runs/{project.curve_run}/quality?target_precision=0.5")[1]["schemas"]["sentiment"][
        "threshold"
    ]
    assert looser["kept"] >= threshold.get("kept", 0), "a lower target keeps at least as many"
    assert project.api(f"/runs/{project.curve_run}/quality?target_precision=1.5")[0] == 422


def _right(svc: Services, run_id: str, gold: dict[str, str]) -> dict[str, bool]:
    lines = [json.loads(line) for line in run_paths(svc, run_id).predictions.read_text().splitlines()]
    return {
        p["instance_id"]: p["payload"]["label"] == gold[p["instance_id"]] for p in lines if p["instance_id"] in gold
    }


def test_two_runs_side_by_side_in_the_api_and_the_cli(project: Project) -> None:
    a, b = project.baseline_run, project.curve_run
    status, found = project.api(f"/runs/{a}/compare/{b}")
    assert status == 200, found
    s = found["schemas"]["sentiment"]
    gold = {
        json.loads(line)["instance_id"]: json.loads(line)["targets"]["sentiment"]
        for split in ("val", "test")
        for line in (run_paths(project.svc, b).bundle_dir / f"{split}.jsonl").read_text().splitlines()
    }
    right_a, right_b = _right(project.svc, a, gold), _right(project.svc, b, gold)
    assert s["n"] == len(gold)
    assert s["mcnemar"]["only_a"] == sum(right_a[i] and not right_b[i] for i in gold)
    assert s["mcnemar"]["only_b"] == sum(right_b[i] and not right_a[i] for i in gold)
    assert s["disagree"] == len(s["disagreements"]) > 0
    assert any(d["annotators"] for d in s["disagreements"]), "the annotators' labels beside the items"
    assert sum(map(sum, s["b"]["confusion"]["counts"])) == s["n"]
    table = project.cli("compare", a, b, str(project.config))
    assert table.returncode == 0, table.stderr
    assert f"A: run {a} (majority-baseline)   B: run {b} (sklearn-text)" in table.stdout
    assert "McNemar (" in table.stdout and s["said"] in table.stdout
    assert s["disagreements"][0]["instance_id"] in table.stdout
    as_json = project.cli("compare", a, b, str(project.config), "--json")
    assert json.loads(as_json.stdout) == found
    same = project.cli("compare", a, a, str(project.config))
    assert same.returncode == 1 and f"both runs are {a}" in same.stderr and "pick two different runs" in same.stderr


def test_a_server_killed_while_it_writes_the_order_leaves_no_file_in_the_project(
    tmp_path: Path, redis_server_url: str
) -> None:
    """The writer is killed by a signal in the middle of writing the new data file (RLIMIT_FSIZE's SIGXFSZ,
    at its default action: a kill at a known point, as a SIGKILL would come at an unknown one): the project's
    data folder is as it was, the temp file lies in potato-queue's own staging folder, and the next server
    start removes it."""
    import signal
    import subprocess
    import sys

    from potato_queue.bundle.read import read_items
    from potato_queue.store.keys import staging_dir
    from potato_queue.validate import load_checked

    config_path = make_project(tmp_path)
    add_potato_keys(config_path, **POTATO_ORDER_KEYS)
    config = load_checked(config_path)
    data_dir = config.data_paths()[0].parent
    before = {p.name: p.read_bytes() for p in data_dir.iterdir()}
    assert sum(len(b) for b in before.values()) > 4096
    writer = (
        "import resource, signal, sys\n"
        "from potato_queue.insight.potato_order import hand_to_potato\n"
        "from potato_queue.validate import load_checked\n"
        "config = load_checked(sys.argv[1])\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "hand_to_potato(config, sys.argv[2:])\n"
    )
    killed = subprocess.run(
        [sys.executable, "-c", writer, str(config_path), *sorted(read_items(config))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert killed.returncode == -signal.SIGXFSZ, killed.stderr
    assert {p.name: p.read_bytes() for p in data_dir.iterdir()} == before, "nothing new or changed among the data"
    assert len(list(staging_dir(config).iterdir())) == 1, "the killed writer's temp file, in potato-queue's folder"
    svc = Services(config_path, redis_server_url, tmp_path)
    try:
        svc.serve()
        assert list(staging_dir(config).iterdir()) == []
    finally:
        svc.stop()


def test_the_insight_a_run_kept_at_finalize_says_what_its_files_say_and_follows_new_labels(project: Project) -> None:
    """insight.json is what the run page reads instead of 15 MB of predictions and the whole bundle at 100,000
    items: quality and what to label next answer the same from it as from the run's files read again, and an
    item labelled since the run leaves the list once its annotator's file changes."""
    kept = run_paths(project.svc, project.curve_run).insight_inputs
    assert kept.is_file(), "written at the run's finalize"
    from_kept = [project.api(f"/runs/{project.curve_run}/{path}")[1] for path in ("quality", "next?limit=80")]
    moved = kept.with_name("insight.json.aside")
    kept.rename(moved)
    try:
        from_files = [project.api(f"/runs/{project.curve_run}/{path}")[1] for path in ("quality", "next?limit=80")]
    finally:
        moved.rename(kept)
    assert from_kept == from_files
    first = from_kept[1]["items"][0]["instance_id"]
    status, top20 = project.api(f"/runs/{project.curve_run}/next?limit=20")
    assert status == 200 and top20["items"] == from_kept[1]["items"][:20], "the first 20 of the whole order"
    state = project.config.parent / "annotation_output" / "late-annotator" / "user_state.json"
    state.parent.mkdir()
    state.write_text(
        json.dumps(
            {
                "user_id": "late-annotator",
                "instance_id_to_label_to_value": {first: [[{"schema": "sentiment", "name": "positive"}, "positive"]]},
            }
        )
    )
    try:
        status, after = project.api(f"/runs/{project.curve_run}/next?limit=80")
    finally:
        state.unlink()
        state.parent.rmdir()
    assert (
        status == 200
        and after["total"] == from_kept[1]["total"] - 1
        and first not in [i["instance_id"] for i in after["items"]]
    )
    # the annotators' files as the run's bundle saw them: nothing labelled since, nothing read
    from potato_queue.bundle.inputs import annotation_files
    from potato_queue.insight.inputs import labelled_now
    from potato_queue.validate import load_checked

    config = load_checked(project.config)
    assert labelled_now(config, annotation_files(config)) == frozenset()
    read = labelled_now(config, [["files-that-changed", 1, 1]])
    assert len(read) >= 360 and read == labelled_now(config), "the example's labelled items, read"
    status, summary = project.api(f"/runs/{project.curve_run}/predictions/summary")
    lines = run_paths(project.svc, project.curve_run).predictions.read_text().splitlines()
    assert status == 200 and summary["total"] == len(lines) and summary["not_predictions"] == 0
    assert sum(summary["counts"].values()) == len(lines) and len(summary["sample"]) == 10
    assert summary["sample"][0] == json.loads(lines[0])
