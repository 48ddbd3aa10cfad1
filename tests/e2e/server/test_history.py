"""A project's history, every run of it reachable (issue 52): the API pages the runs with a cursor and says how
many there are, `training runs` takes --limit, --before and --all, and /metrics reads a finished run once, not
on every scrape. Real run folders in a real run store (Redis, run.json); the server in process (TestClient)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis

from potato_queue.clock import REAL_CLOCK
from potato_queue.run import RunState
from potato_queue.server.run_tally import FinishedRuns
from potato_queue.store import RunStore
from potato_queue.store.keys import metrics_tally_path, new_run_id
from potato_queue.store.listing import RunListing
from potato_queue.validate import load_checked
from tests.conftest import run_cli
from tests.lifecycle_helpers import ADMIN_KEY, make_project

RUNS = 23
START = datetime(2026, 11, 2, 9, 0, 0, tzinfo=timezone.utc)


def finished(store: RunStore, run_id: str) -> str:
    store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local", run_id=run_id)
    for step in (RunState.STARTING, RunState.RUNNING, RunState.COLLECTING, RunState.SUCCEEDED):
        assert store.transition(run_id, step) is not None
    return run_id


@pytest.fixture
def history(tmp_path: Path, redis_server_url: str) -> Iterator[tuple[Path, RunStore, list[str]]]:
    """RUNS finished runs, a second apart (two share their creation second), oldest first."""
    config = make_project(tmp_path)
    store = RunStore(load_checked(config), redis.Redis.from_url(redis_server_url))
    ids = [new_run_id(START + timedelta(seconds=i)) for i in range(RUNS - 1)]
    ids.insert(5, new_run_id(START + timedelta(seconds=4)))  # the same second as the run before it
    for run_id in ids:
        finished(store, run_id)
    yield config, store, ids


def test_every_run_can_be_listed_a_page_at_a_time_by_the_api(
    history: tuple[Path, RunStore, list[str]], redis_server_url: str
) -> None:
    from fastapi.testclient import TestClient

    from potato_queue.server.app import create_app

    config, _, ids = history
    app = create_app(load_checked(config), redis_server_url, enqueue=lambda run_id: None)
    seen: list[str] = []
    with closing(TestClient(app)) as client:
        path = "/admin/training/api/runs?limit=10"
        while True:
            reply = client.get(path, headers={"X-API-Key": ADMIN_KEY})
            assert reply.status_code == 200, reply.text
            assert reply.headers["X-Total-Count"] == str(RUNS)
            seen += [run["run_id"] for run in reply.json()]
            if "X-Next-Before" not in reply.headers:
                break
            assert reply.headers["Link"] == (
                f'</admin/training/api/runs?limit=10&before={reply.headers["X-Next-Before"]}>; rel="next"'
            )
            path = f"/admin/training/api/runs?limit=10&before={reply.headers['X-Next-Before']}"
        gone = client.get(
            f"/admin/training/api/runs?before={new_run_id(START - timedelta(days=1))}", headers={"X-API-Key": ADMIN_KEY}
        )
    assert seen == list(reversed(ids)), "every run once, newest first, across three pages"
    assert gone.status_code == 404 and "to list the runs before" in gone.text


def test_training_runs_takes_a_limit_a_cursor_and_all(history: tuple[Path, RunStore, list[str]]) -> None:
    config, _, ids = history

    def listed(*args: str) -> list[str]:
        out = run_cli("training", "runs", config, *args)
        assert out.returncode == 0, out.stderr
        return [line.split()[0] for line in out.stdout.splitlines()[1:] if line[:1].isdigit()]

    newest = run_cli("training", "runs", config, "--limit", "5")
    assert f"the newest 5 of {RUNS} runs; older ones: --before {ids[-5]} (or --all)" in newest.stdout
    assert listed("--limit", "5") == list(reversed(ids[-5:]))
    assert listed("--limit", "5", "--before", ids[-5]) == list(reversed(ids[-10:-5]))
    assert listed("--all") == list(reversed(ids))
    assert "older ones" not in run_cli("training", "runs", config, "--all").stdout
    unknown = run_cli("training", "runs", config, "--before", new_run_id(START - timedelta(days=1)))
    assert unknown.returncode == 1 and "No run" in unknown.stderr


def test_metrics_read_a_finished_run_once_and_follow_new_and_removed_runs(
    history: tuple[Path, RunStore, list[str]],
) -> None:
    _, store, ids = history
    tally = FinishedRuns()
    counts, live = tally.scrape(store)
    assert counts.states[("succeeded", "local")] == RUNS and live == []
    # A finished run's share is kept: its run.json is not read again (spoiled here, it would list as broken).
    store.paths(ids[0]).run_json.write_text("{not json")
    fresh = finished(store, new_run_id(START + timedelta(minutes=5)))
    queued = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")["run_id"]
    shutil.rmtree(store.paths(ids[1]).dir)  # retention removed a run's folder
    counts, live = tally.scrape(store)
    assert counts.states[("succeeded", "local")] == RUNS  # +1 new, -1 removed, the spoiled one still counted
    assert [r["run_id"] for r in live] == [queued] and counts.states[("queued", "local")] == 1
    assert fresh in tally.counted and ids[1] not in tally.counted


def test_a_new_server_reads_the_tally_file_not_every_record(history: tuple[Path, RunStore, list[str]]) -> None:
    """A server's start costs one small file, not a year of run.json; a file that is not ours is rebuilt."""
    _, store, ids = history
    path = metrics_tally_path(store.config)
    used = json.loads(store.paths(ids[-1]).run_json.read_text())
    used.update(started_at="2026-11-02T09:00:00Z", finished_at="2026-11-02T09:10:00Z")
    used["gpu_usage"] = {"gpus": [{"index": 0, "name": "H100"}], "gpu_seconds": 1800.0, "energy_wh": 250.0}
    store.paths(ids[-1]).run_json.write_text(json.dumps(used))
    read, _ = FinishedRuns(path).scrape(store)
    kept, _ = FinishedRuns(path).scrape(store)
    assert kept.counters() == read.counters() and read.gpu_hours["local"] == 0.5 and read.kwh["local"] == 0.25
    assert read.durations_s["local"] == 600.0
    assert path.stat().st_mode & 0o777 == 0o600
    for run_id in ids[:3]:
        store.paths(run_id).run_json.write_text("{not json")  # read again, these would list as broken
    shutil.rmtree(store.paths(ids[3]).dir)
    counts, _ = FinishedRuns(path).scrape(store)
    assert counts.states[("succeeded", "local")] == RUNS - 1
    assert not any(state == "broken" for state, _ in +counts.states), "the spoiled records were not read"
    assert ids[3] not in json.loads(path.read_text())["shares"], "the removed run left the file too"

    good = json.loads(path.read_text())
    spoiled_total = {**good, "tally": {**good["tally"], "kwh": {"local": "x"}}}
    spoiled_share = {**good, "shares": {**good["shares"], ids[4]: ["succeeded", "local", None, -1, 0]}}
    for spoiled in (spoiled_total, spoiled_share):
        path.write_text(json.dumps(spoiled))
        if spoiled is spoiled_share:
            shutil.rmtree(store.paths(ids[4]).dir)  # a spoiled share is found as it is taken out
        rebuilt, _ = FinishedRuns(path).scrape(store)
        removed = 2 if spoiled is spoiled_share else 1
        assert rebuilt.states[("succeeded", "local")] == RUNS - 3 - removed, "set aside: the records are read"
        assert sum(n for (state, _), n in rebuilt.states.items() if state == "broken") == 3
        assert rebuilt.kwh["local"] == 0.25


@pytest.mark.unit
def test_the_listing_orders_a_seconds_ties_and_waits_for_a_run_json(tmp_path: Path) -> None:
    created: dict[str, str] = {}
    listing = RunListing(tmp_path, lambda run_id: created[run_id], REAL_CLOCK.now_s)
    assert listing.ids() == []
    late, early, next_second = "20261102T090000-bbbbbb", "20261102T090000-aaaaaa", "20261102T090001-000000"
    for run_id, at in ((late, "2026-11-02T09:00:00.900Z"), (early, "2026-11-02T09:00:00.100Z"), (next_second, "")):
        (tmp_path / run_id).mkdir()
        created[run_id] = at
    (tmp_path / "not-a-run").mkdir()
    assert listing.ids() == [], "no run.json yet: not a run"
    for run_id in (late, next_second):
        (tmp_path / run_id / "run.json").write_text("{}")
    assert listing.ids() == [late, next_second]
    (tmp_path / early / "run.json").write_text("{}")
    # `late`'s id sorts after `early`'s by its random tail; created_at (ms) orders them.
    assert listing.ids() == [early, late, next_second]
    shutil.rmtree(tmp_path / late)
    assert listing.ids() == [early, next_second]
    assert json.dumps(listing.ids())  # a copy the caller may keep
    # A new process's listing, told which folders held a record (the metrics index): those are not looked into.
    (tmp_path / next_second / "run.json").unlink()
    fresh = RunListing(tmp_path, lambda run_id: created[run_id], REAL_CLOCK.now_s)
    fresh.vouch({next_second})
    assert fresh.ids() == [early, next_second]
    assert RunListing(tmp_path, lambda run_id: created[run_id], REAL_CLOCK.now_s).ids() == [early]


def test_an_ended_runs_redis_keys_expire_once_its_record_is_on_disk(history: tuple[Path, RunStore, list[str]]) -> None:
    """Redis holds the live state: a project's thousands of ended runs leave no key there for good."""
    from potato_queue.store.in_flight import FINISHED_TTL_S

    _, store, ids = history
    for run_id in ids[-3:]:
        assert 0 < store.redis.ttl(store.keys.run(run_id)) <= FINISHED_TTL_S
    queued = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")["run_id"]
    assert store.redis.ttl(store.keys.run(queued)) == -1, "a run not ended keeps its live state"
    store.redis.delete(store.keys.run(ids[-1]))  # as when it expired: the record still reads whole
    assert store.get(ids[-1])["state"] == RunState.SUCCEEDED


def test_run_folders_past_retain_run_records_days_go_unless_something_cites_them(
    tmp_path: Path, redis_server_url: str
) -> None:
    from potato_queue.runs.record_retention import prune_old_records
    from potato_queue.store.keys import project_predictions_path

    store = RunStore(load_checked(make_project(tmp_path)), redis.Redis.from_url(redis_server_url))
    long_ago = datetime.now(timezone.utc) - timedelta(days=400)

    def old(k: int) -> str:
        return new_run_id(long_ago + timedelta(minutes=k))

    plain, published, rated, retried, latest = (finished(store, old(k)) for k in range(5))
    queued = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local", run_id=old(5))["run_id"]
    retry = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")["run_id"]
    store.update(retried, retried_by=retry)
    line = {"run_id": published, "instance_id": "r1", "schema_name": "sentiment", "payload": {"label": "positive"}}
    project_predictions_path(store.config).write_text(json.dumps(line) + "\n")
    rater = store.config.output_path / "potato-queue.majority-baseline.sentiment"
    rater.mkdir()
    (rater / "user_state.json").write_text(json.dumps({"user_id": rater.name, "origin": {"run_id": rated}}))
    assert prune_old_records(store, None) == [], "None keeps every record"
    assert prune_old_records(store, 365) == [plain]
    assert not store.paths(plain).dir.exists() and plain not in store.run_ids()
    assert store.redis.exists(store.keys.run(plain)) == 0
    kept = {published, rated, retried, latest, queued, retry}
    assert kept <= set(store.run_ids()), "what Potato's prelabels, a rater, a retry cite; the latest success"
    assert prune_old_records(store, 365) == []


@pytest.mark.unit
def test_following_a_run_into_a_log_prints_a_line_a_step_and_quarter_not_one_a_progress_count() -> None:
    """`retry --follow` (and run, rerun) without a terminal: a 120-step run is five lines, not 120."""
    from potato_queue.cli.output import progress_mark

    def record(current: int, step: str = "training sentiment") -> dict[str, Any]:
        return {"state": "running", "step": step, "progress": {"phase": "train", "current": current, "total": 120}}

    marks = {progress_mark(record(k)) for k in range(121)}
    assert len(marks) == 5  # 0-29, 30-59, 60-89, 90-119, 120
    assert progress_mark(record(3, "predicting")) != progress_mark(record(3)), "a new step is a new line"


def test_a_queued_run_whose_folder_was_removed_does_not_stop_the_queue(tmp_path: Path, redis_server_url: str) -> None:
    """A folder removed by hand (or by a careless cleanup) under a queued run: the executor leaves it out and
    runs the next; before, it raised on it at every wake-up, and nothing behind it ever ran."""
    from tests.lifecycle_helpers import TERMINAL, started

    with started(tmp_path, redis_server_url, executors=0) as svc:
        store = RunStore(load_checked(svc.config), redis.Redis.from_url(redis_server_url))
        lost = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")["run_id"]
        shutil.rmtree(store.paths(lost).dir)
        behind = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
        svc.executor()
        assert svc.wait_for(behind, TERMINAL, 120)["state"] == "succeeded", svc.logs()
        assert lost not in [run_id for run_id, _ in store.index.unfinished()]
        assert f"queued run {lost} has no run.json any more: left out of the queue" in svc.logs()
