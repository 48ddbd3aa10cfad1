"""Runs reach Potato itself: potato-annotation 2.12.1 from PyPI (the `potato` extra), not a stand-in.

A real run (Redis, server, executor, agent, worker) on the local backend, with Potato's own server
started on 127.0.0.1 for the same project: the rows in Potato's tables, read through Potato's own
functions; its runs API and events route; what it publishes at a restart ("Restored N") against its
four rules (another run's train split, a reviewer's rejection and the confidence floor all in play);
its model review and a new annotator's first, pre-checked item; its retraction route.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.lifecycle_helpers import ADMIN_KEY, TERMINAL, Services, make_project, run_paths
from tests.potato_helpers import PotatoServer, add_potato_keys, potato_view

FLOOR = 0.72  # writeback.min_confidence: sklearn-text's confidences on the small project straddle it
EARLIER = "20260101T000000-abc123"  # a run Potato itself made earlier, with another split


@dataclass
class Flow:
    config: Path
    potato_cfg: dict[str, Any]
    svc: Services
    potato: PotatoServer
    run_id: str
    run: dict[str, Any]
    earlier_train: list[str]
    rejected: str
    listed_while_up: list[dict[str, Any]]
    prelabelled_while_up: int


def _earlier_history(config: Path, cfg: dict[str, Any], tmp: Path) -> tuple[list[str], str]:
    """An earlier Potato run whose train split holds items this run will hold out, and a reviewer's
    rejection of a prelabel on an unlabelled item; both written with Potato's own functions."""
    from potato import model_review
    from potato.training import store

    from potato_queue.bundle import build_bundle
    from potato_queue.validate import load_checked

    preview = tmp / "preview"
    build_bundle(load_checked(config), preview, ["sentiment"])
    held_out = [
        json.loads(line)["instance_id"]
        for split in ("val", "test")
        for line in (preview / f"{split}.jsonl").read_text().splitlines()
    ]
    unlabeled = [json.loads(line)["instance_id"] for line in (preview / "unlabeled.jsonl").read_text().splitlines()]
    earlier_train = held_out[:6]
    store.record_run(
        cfg,
        store.TrainingRun(
            run_id=EARLIER, trainer="sklearn-text", schema_names=["sentiment"], status="success", split_seed=7
        ),
    )
    store.record_run_items(cfg, EARLIER, {"train": earlier_train})
    model_review.record_verdict(
        cfg,
        model_review.ReviewVerdict(
            instance_id=unlabeled[0], reviewer="dana", verdict="reject", schema_name="sentiment"
        ),
    )
    return earlier_train, unlabeled[0]


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory, redis_server_url: str) -> Iterator[Flow]:
    tmp = tmp_path_factory.mktemp("potato-flow")
    config = make_project(
        tmp, grace_seconds=2, writeback={"schemas": ["sentiment"], "include_unlabeled": True, "min_confidence": FLOOR}
    )
    add_potato_keys(config)
    cfg = potato_view(config)
    earlier_train, rejected = _earlier_history(config, cfg, tmp)
    potato, svc = PotatoServer(config, tmp, ADMIN_KEY), Services(config, redis_server_url, tmp)
    try:
        potato.start()
        svc.serve()
        svc.executor()
        run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"])
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "succeeded", (run, svc.logs())
        listed = potato.api("GET", "/admin/training/api/runs")[1]["runs"]
        prelabelled = potato.api("GET", "/admin/model-review")[1]["n_prelabelled"]
        potato.restart()
        yield Flow(config, cfg, svc, potato, run_id, run, earlier_train, rejected, listed, prelabelled)
    finally:
        svc.stop()
        potato.stop()


def _bundle_ids(flow: Flow, split: str) -> list[str]:
    path = run_paths(flow.svc, flow.run_id).bundle_dir / f"{split}.jsonl"
    return [json.loads(line)["instance_id"] for line in path.read_text().splitlines()]


def _run_predictions(flow: Flow) -> list[dict[str, Any]]:
    path = run_paths(flow.svc, flow.run_id).predictions
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_run_its_splits_and_every_prediction_are_rows_in_potatos_store(flow: Flow) -> None:
    from potato.training import store

    row = store.load_run(flow.potato_cfg, flow.run_id)
    assert row is not None, "the run is in Potato's training_runs"
    assert (row.status, row.backend, row.trainer, row.trigger) == (
        "success",
        "potato-queue/local",
        "sklearn-text",
        "api",
    )
    assert (row.n_train, row.n_val, row.n_test) == tuple(len(_bundle_ids(flow, s)) for s in ("train", "val", "test"))
    assert row.metrics["accuracy"] == flow.run["held_out"]["sentiment"]["test"]["accuracy"]
    assert row.metrics["val_macro_f1"] == flow.run["held_out"]["sentiment"]["val"]["macro_f1"]
    assert row.model_version == f"sklearn-text-{flow.run_id}" and row.artifact_dir == flow.run["artifact_uri"]
    assert row.started_at and row.finished_at and row.finished_at >= row.started_at
    splits = store.run_item_splits(flow.potato_cfg, flow.run_id)
    assert sorted(i for i, s in splits.items() if s == "train") == sorted(_bundle_ids(flow, "train"))
    assert not set(splits) & set(_bundle_ids(flow, "unlabeled")), "Potato keeps predict-only items out of a run's items"
    stored = store.load_predictions(flow.potato_cfg, run_id=flow.run_id)
    sent = _run_predictions(flow)
    assert sorted((p["instance_id"], p["confidence"]) for p in stored) == sorted(
        (p["instance_id"], p["confidence"]) for p in sent
    ), "every prediction, ungated"


def test_a_run_written_while_potato_is_up_is_listed_at_once_and_published_only_after_a_restart(flow: Flow) -> None:
    listed = {r["run_id"]: r for r in flow.listed_while_up}
    assert listed[flow.run_id]["status"] == "success" and listed[flow.run_id]["backend"] == "potato-queue/local"
    # Potato 2.12.1 has no route to ingest a run from outside: a release that adds one changes this line.
    assert flow.prelabelled_while_up == 0
    assert flow.potato.restored() > 0


def _expected_published(flow: Flow) -> list[dict[str, Any]]:
    train = set(_bundle_ids(flow, "train")) | set(flow.earlier_train)
    return [
        p
        for p in _run_predictions(flow)
        if p["instance_id"] not in train and p["instance_id"] != flow.rejected and p["confidence"] >= FLOOR
    ]


def test_potato_publishes_at_its_restart_exactly_what_passes_its_four_rules(flow: Flow) -> None:
    sent = {p["instance_id"]: p for p in _run_predictions(flow)}
    guarded = set(flow.earlier_train) & set(sent)
    low = {i for i, p in sent.items() if p["confidence"] < FLOOR}
    assert guarded and low and flow.rejected in sent, "the run predicted items each rule keeps off"
    expected = _expected_published(flow)
    assert flow.potato.restored() == len(expected) > 0, flow.potato.log()[-2000:]
    published = [
        json.loads(line)
        for line in (flow.config.parent / "annotation_output" / "training" / "predictions.jsonl")
        .read_text()
        .splitlines()
    ]
    assert sorted(p["instance_id"] for p in published) == sorted(p["instance_id"] for p in expected)
    assert not {p["instance_id"] for p in published} & (guarded | low | {flow.rejected})
    log = run_paths(flow.svc, flow.run_id).run_log.read_text()
    assert f"published {len(expected)} of this run's {len(sent)} predictions as prelabels" in log, log


def test_potatos_runs_api_and_events_route_show_the_run(flow: Flow) -> None:
    status, run = flow.potato.api("GET", f"/admin/training/api/runs/{flow.run_id}")
    assert status == 200 and run["trainer"] == "sklearn-text" and run["metrics"]["accuracy"] is not None
    status, events = flow.potato.api("GET", f"/admin/training/api/runs/{flow.run_id}/events?limit=1000")
    ours = [json.loads(line) for line in run_paths(flow.svc, flow.run_id).events.read_text().splitlines()]
    assert status == 200 and events["events"] == ours[-1000:] and any(e["event"] == "result" for e in ours)


def test_model_review_serves_the_prelabels_least_confident_first_to_a_new_annotator(flow: Flow) -> None:
    expected = sorted(_expected_published(flow), key=lambda p: p["confidence"])
    status, review = flow.potato.api("GET", "/admin/model-review")
    assert status == 200 and review["n_prelabelled"] == len(expected), review
    assert review["queue"][0] == expected[0]["instance_id"]
    page = flow.potato.first_page_of("erin")
    served = re.search(r'id="instance_id" name="instance_id" type="hidden" value="([^"]+)"', page)
    assert served and served.group(1) == expected[0]["instance_id"], page[-3000:]
    label = expected[0]["payload"]["label"]
    assert re.search(rf'<input checked="True"[^>]*value="{label}"', page), "the model's answer comes pre-checked"


def test_potatos_delete_route_retracts_the_runs_prelabels(flow: Flow) -> None:
    from potato.training import store

    n = len(store.load_predictions(flow.potato_cfg, run_id=flow.run_id))
    status, reply = flow.potato.api("DELETE", f"/admin/training/api/runs/{flow.run_id}/predictions")
    assert status == 200 and reply == {"retracted": n}
    assert flow.potato.api("GET", "/admin/model-review")[1]["n_prelabelled"] == 0
    assert store.load_predictions(flow.potato_cfg, run_id=flow.run_id) == []
