"""A run folder written by an earlier version (tests/fixtures/early_december_run), walked through every action
(issue 52): what it lacks is said as what that version did not record, never a false reason; what needs its
removed bundle refuses without changing anything; the rest works. A real run store (Redis, run folders), the
server in process (TestClient), the CLI as a user runs it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import redis

from potato_queue.run import RunState
from potato_queue.store import RunStore
from potato_queue.store.keys import runs_dir
from potato_queue.validate import load_checked
from tests.conftest import run_cli
from tests.e2e.server.test_page import browser  # noqa: F401 - the fixture: one chromium for the module
from tests.lifecycle_helpers import ADMIN_KEY, make_project

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "early_december_run"
OLD = "20261201T093012-5c2e7a"


@pytest.fixture
def upgraded(tmp_path: Path, redis_server_url: str) -> Iterator[tuple[Path, RunStore, Any]]:
    """The small project with the old run's folder in it, and a run of today beside it."""
    from fastapi.testclient import TestClient

    from potato_queue.server.app import create_app

    config = make_project(tmp_path)
    cfg = load_checked(config)
    shutil.copytree(FIXTURE / OLD, runs_dir(cfg) / OLD)
    store = RunStore(cfg, redis.Redis.from_url(redis_server_url))
    today = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")["run_id"]
    for step in (RunState.STARTING, RunState.RUNNING, RunState.COLLECTING, RunState.SUCCEEDED):
        assert store.transition(today, step) is not None
    with closing(TestClient(create_app(cfg, redis_server_url, enqueue=lambda run_id: None))) as client:
        client.headers["X-API-Key"] = ADMIN_KEY
        yield config, store, client


def test_an_earlier_versions_run_says_what_it_never_recorded_and_every_action_answers(
    upgraded: tuple[Path, RunStore, Any],
) -> None:
    config, store, client = upgraded
    api = "/admin/training/api"
    before = (store.paths(OLD).run_json.read_bytes(), sorted(p.name for p in store.paths(OLD).dir.iterdir()))
    run = client.get(f"{api}/runs/{OLD}").json()
    assert run["state"] == "succeeded" and run["held_out"]["sentiment"]["test"]["n"] > 0
    assert run["predates"] == {
        "agreement": "No agreement figures: the run was recorded by an earlier potato-queue (its run.json has no "
        "record_version), before they were worked out at a run's end.",
        "gpu_use": "not recorded: the run was recorded by an earlier potato-queue (its run.json has no "
        "record_version), before GPU use was measured",
        "made_with": "not recorded: the run was recorded by an earlier potato-queue (its run.json has no "
        "record_version), before what made a run was recorded",
    }
    today = client.get(f"{api}/runs").json()[0]
    assert today["run_id"] != OLD and "predates" not in today, "a run of today has no such words"
    assert OLD in [r["run_id"] for r in client.get(f"{api}/runs").json()]
    assert client.get(f"{api}/runs/{OLD}/log").text.endswith("newest 1 others)\n")
    # What needs its bundle refuses, naming why; nothing of the run changes.
    for method, path in (("POST", "rater"), ("POST", "rerun"), ("GET", f"compare/{today['run_id']}")):
        reply = client.request(method, f"{api}/runs/{OLD}/{path}")
        assert reply.status_code == 409, (path, reply.text)
        assert "bundle was removed" in reply.json()["detail"], (path, reply.text)
    assert "only a failed or cancelled run can be retried" in client.post(f"{api}/runs/{OLD}/retry").text
    assert (store.paths(OLD).run_json.read_bytes(), sorted(p.name for p in store.paths(OLD).dir.iterdir())) == before
    assert not list(config.parent.glob("annotation_output/potato-queue.*")), "no rater was written"
    # What needs no bundle works: the predictions download, /metrics, the listing, the budget's strike.
    assert client.get(f"/admin/training/api/runs/{OLD}/predictions.jsonl").status_code == 200
    metrics = client.get("/metrics").text
    assert 'potato_queue_runs{state="succeeded",backend="local"} 2' in metrics
    listed = run_cli("training", "runs", config)
    assert listed.returncode == 0 and OLD in listed.stdout, listed.stderr
    struck = client.post(f"{api}/runs/{OLD}/strike_usage", json={"reason": "an old run"})
    assert struck.status_code == 200 and struck.json()["usage_struck"]["gpu_hours"] == 0


def test_the_run_page_of_an_earlier_versions_run_says_what_it_never_recorded(
    tmp_path: Path,
    redis_server_url: str,
    browser: Any,  # noqa: F811 - the fixture
) -> None:
    from tests.e2e.server.test_page import signed_in
    from tests.lifecycle_helpers import started

    with started(tmp_path, redis_server_url, executors=0) as svc:
        shutil.copytree(FIXTURE / OLD, runs_dir(load_checked(svc.config)) / OLD)
        page = signed_in(browser, svc)
        page.goto(f"{svc.url}/admin/training/runs/{OLD}")
        page.wait_for_selector("#agreement p", timeout=30000)
        facts = page.text_content("#facts") or ""
        assert "GPU usenot recorded: the run was recorded by an earlier potato-queue" in facts, facts
        assert "Made withnot recorded: the run was recorded by an earlier potato-queue" in facts, facts
        assert page.text_content("#agreement p") == (
            "No agreement figures: the run was recorded by an earlier potato-queue (its run.json has no "
            "record_version), before they were worked out at a run's end."
        )
        page.close()
