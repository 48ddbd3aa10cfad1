"""A run's whole life on the local backend: real Redis, real server, real executors, real agent and worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lifecycle_helpers import Services, make_project


@pytest.fixture
def services(tmp_path: Path, redis_server_url: str) -> Iterator[Services]:
    svc = Services(make_project(tmp_path, grace_seconds=2), redis_server_url, tmp_path)
    svc.serve()
    try:
        yield svc
    finally:
        svc.stop()


def test_sklearn_run_succeeds_with_held_out_scores_and_predictions(services: Services) -> None:
    services.executor()
    run_id = services.start_run(trainer="sklearn-text", schemas=["sentiment"])
    run = services.wait_for(run_id, {"succeeded", "failed", "cancelled"})
    assert run["state"] == "succeeded", (run, services.logs())
    assert run["ran_on"] == "local"
    for split in ("val", "test"):
        scores = run["held_out"]["sentiment"][split]
        assert scores["n"] > 0 and 0.0 <= scores["accuracy"] <= 1.0 and 0.0 <= scores["macro_f1"] <= 1.0
    run_dir = services.config.parent / "annotation_output" / "training" / "runs" / run_id
    lines = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    assert lines and set(lines[0]) == {"instance_id", "schema_name", "payload", "confidence"}
    assert set(lines[0]["payload"]) == {"label", "confidence"}
    status, published = services.api("GET", "/predictions")
    assert status == 200 and published
    assert all(p["confidence"] >= 0.6 and p["schema_name"] == "sentiment" for p in published)
    status, events = services.api("GET", f"/runs/{run_id}/events")
    assert any(e["event"] == "result" for e in events)
    assert (run_dir / "artifacts").is_dir() and any((run_dir / "artifacts").iterdir())


def test_admin_api_refuses_without_key_unknown_backend_trainer_schema(services: Services) -> None:
    assert services.api("GET", "/runs", key=None)[0] == 401
    assert services.api("GET", "/runs", key="wrong")[0] == 401
    status, reply = services.api("POST", "/runs", {"trainer": "sklearn-text", "schemas": ["sentiment"], "backend": "gpu"})
    assert status == 409 and "configured backends: local" in reply["detail"]
    status, reply = services.api("POST", "/runs", {"trainer": "sklearn-txt", "schemas": ["sentiment"]})
    assert status == 400 and "sklearn-text" in reply["detail"]
    status, reply = services.api("POST", "/runs", {"trainer": "sklearn-text", "schemas": ["mood"]})
    assert status == 400 and "schemas: sentiment" in reply["detail"]


def test_cancel_queued_run_never_starts(services: Services) -> None:
    # No executor yet: the run waits in the queue.
    run_id = services.start_run(trainer="sklearn-text", schemas=["sentiment"])
    status, reply = services.api("POST", f"/runs/{run_id}/cancel")
    assert (status, reply["state"]) == (200, "cancelled")
    services.executor()
    second = services.start_run(trainer="sklearn-text", schemas=["sentiment"])
    services.wait_for(second, {"succeeded"})
    run = services.api("GET", f"/runs/{run_id}")[1]
    assert run["state"] == "cancelled" and run["started_at"] is None


def test_two_executors_five_runs_one_at_a_time_in_order(services: Services) -> None:
    services.executor()
    services.executor()
    ids = [services.start_run(trainer="sklearn-text", schemas=["sentiment"]) for _ in range(5)]
    runs = [services.wait_for(i, {"succeeded", "failed", "cancelled"}, timeout_s=240) for i in ids]
    assert [r["state"] for r in runs] == ["succeeded"] * 5, services.logs()
    starts = [r["started_at"] for r in runs]
    assert starts == sorted(starts)
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert earlier["finished_at"] <= later["started_at"]
