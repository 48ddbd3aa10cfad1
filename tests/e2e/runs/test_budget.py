"""The monthly GPU budget (issue 38): a run that would pass a cap is refused before it starts, with the figures
and the fix (the API's 409, the CLI's exit 1); auto-retrain skips, saying why; the page's API says what is used
and left. The month's earlier runs are real records in a real run store (Redis, run.json), their GPU use
written as an agent's usage event leaves it; the GPU itself is what this machine lacks."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis

from potato_queue.config import BudgetConfig
from potato_queue.errors import Conflict
from potato_queue.lab.budget import Cap, caps, estimate, month_of, month_words
from potato_queue.run import RunState
from potato_queue.runs import retrain
from potato_queue.runs.budget import budget_checked
from potato_queue.runs.service import RunService
from potato_queue.store import RunStore
from potato_queue.store.keys import new_run_id
from potato_queue.validate import load_checked
from tests.conftest import run_cli
from tests.lifecycle_helpers import ADMIN_KEY, make_project

HOUR = {"gpus": ["0"], "gpu_seconds": 3600.0, "energy_wh": 100.0, "mean_utilization_pct": 80.0}


def spent(store: RunStore, run_id: str | None = None, usage: dict[str, Any] = HOUR) -> str:
    """A majority-baseline run on local that used `usage` (default: one GPU-hour, 100 Wh)."""
    record = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local", run_id=run_id)
    store.update(record["run_id"], gpu_usage=usage)
    for state in (RunState.STARTING, RunState.RUNNING, RunState.COLLECTING, RunState.SUCCEEDED):
        assert store.transition(record["run_id"], state) is not None
    return record["run_id"]


@pytest.fixture
def budgeted(tmp_path: Path, redis_server_url: str) -> tuple[Path, RunStore]:
    config = make_project(
        tmp_path,
        max_wall_seconds=7200,
        budget={"gpu_hours_per_month": 2.5, "backends": {"local": {"kwh_per_month": 0.5}}},
        auto_retrain={"enabled": True, "trainer": "majority-baseline", "update_frequency": 1, "min_interval_s": 0},
    )
    store = RunStore(load_checked(config), redis.Redis.from_url(redis_server_url))
    spent(store, new_run_id(datetime.now(timezone.utc) - timedelta(days=40)))  # last month's
    spent(store)
    spent(store)
    return config, store


def test_a_run_that_would_pass_the_months_gpu_hours_is_refused_with_the_figures(
    budgeted: tuple[Path, RunStore],
) -> None:
    config, store = budgeted
    month = month_words(month_of(time.time()))
    service = RunService(load_checked(config), store, enqueue=lambda run_id: None)
    with pytest.raises(Conflict) as refused:
        service.submit(trainer="majority-baseline", schemas=["sentiment"])
    # Last month's hour is not this month's; the estimate is the mean of the last three such runs.
    assert refused.value.message == (
        f"The run would pass the GPU-hours budget of the project for {month}: 2 of 2.5 GPU-hours used, and this "
        "run is estimated at 1 GPU-hours (the mean of the last 3 majority-baseline runs on local)"
    )
    assert (
        refused.value.fix
        == "raise model_training.budget.gpu_hours_per_month, wait for next month, or run on a backend with room left"
    )
    before = len(store.run_ids())
    # A trainer with no measured run yet: max_wall_seconds on one GPU.
    with pytest.raises(
        Conflict,
        match=r"estimated at 2 GPU-hours \(max_wall_seconds \(7200 s\) on one GPU: no "
        r"sklearn-text run on local reported its use yet\)",
    ):
        service.submit(trainer="sklearn-text", schemas=["sentiment"])
    assert len(store.run_ids()) == before, "a refused run leaves no record"
    # The same refusal from the command line: exit 1, the message and its fix.
    out = run_cli("training", "run", config, "--trainer", "majority-baseline", "--schema", "sentiment")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "2 of 2.5 GPU-hours used" in out.stderr and "wait for next month" in out.stderr


def test_runs_not_ended_hold_their_estimate_so_a_burst_cannot_pass_the_cap(
    tmp_path: Path, redis_server_url: str
) -> None:
    config = make_project(tmp_path, budget={"gpu_hours_per_month": 3.5})
    store = RunStore(load_checked(config), redis.Redis.from_url(redis_server_url))
    spent(store)
    spent(store)
    service = RunService(load_checked(config), store, enqueue=lambda run_id: None)
    service.submit(trainer="majority-baseline", schemas=["sentiment"])  # 2 used + 1 estimated: room for it
    with pytest.raises(Conflict) as refused:
        service.submit(trainer="majority-baseline", schemas=["sentiment"])
    assert "2 of 3.5 GPU-hours used, 1 more held by 1 run not ended, and this run is estimated at 1" in str(
        refused.value.message
    )


def test_submissions_at_the_same_instant_are_checked_one_at_a_time_so_only_one_fits(
    tmp_path: Path, redis_server_url: str
) -> None:
    """Eight submitters at once (each its own connection, as the server, the CLI and auto-retrain are), a cap
    with room for one run: one is queued, seven are refused seeing it."""
    config = make_project(tmp_path, budget={"gpu_hours_per_month": 3.5})
    cfg = load_checked(config)
    store = RunStore(cfg, redis.Redis.from_url(redis_server_url))
    spent(store)
    spent(store)
    before = set(store.run_ids())
    submitters = [
        RunService(cfg, RunStore(cfg, redis.Redis.from_url(redis_server_url)), enqueue=lambda run_id: None)
        for _ in range(8)
    ]
    together = threading.Barrier(len(submitters))

    def submit(service: RunService) -> str:
        together.wait()
        try:
            return str(service.submit(trainer="majority-baseline", schemas=["sentiment"])["run_id"])
        except Conflict as refused:
            return str(refused.message)

    with ThreadPoolExecutor(len(submitters)) as pool:
        answers = list(pool.map(submit, submitters))
    queued = set(store.run_ids()) - before
    assert len(queued) == 1 and sorted(queued) == [a for a in answers if a in queued], answers
    refusals = [a for a in answers if a not in queued]
    assert len(refusals) == 7 and all("1 more held by 1 run not ended" in a for a in refusals), refusals


def test_a_budget_lock_held_past_its_wait_refuses_the_run_saying_what_to_do(
    tmp_path: Path, redis_server_url: str
) -> None:
    config = make_project(tmp_path, budget={"gpu_hours_per_month": 3.5})
    cfg = load_checked(config)
    store = RunStore(cfg, redis.Redis.from_url(redis_server_url))
    stalled = store.budget_lease()  # a submitter stalled with the lock (its process stopped, say)
    assert stalled.try_take()
    try:
        with pytest.raises(Conflict) as refused, budget_checked(cfg, store, "majority-baseline", "local", wait_s=0.2):
            store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")
    finally:
        stalled.release()
    assert refused.value.message == (
        "Another submission held the budget's lock for over 0.2 s, so this run's budget could not be checked"
    )
    assert refused.value.fix.startswith("submit the run again")
    assert store.run_ids() == [], "nothing was written"


def test_auto_retrain_skips_a_run_the_budget_refuses_and_says_why(budgeted: tuple[Path, RunStore]) -> None:
    config, store = budgeted
    cfg = load_checked(config)
    decision = retrain.check(cfg, store, enqueue=lambda run_id: None)
    assert decision is not None and not decision.start
    assert decision.reason.startswith("auto-retrain did not start a run: The run would pass the GPU-hours budget")
    assert retrain.last_check(cfg, store)["reason"] == decision.reason


def test_the_page_and_check_say_what_each_cap_used_and_has_left(
    budgeted: tuple[Path, RunStore], redis_server_url: str
) -> None:
    from fastapi.testclient import TestClient

    from potato_queue.server.app import create_app

    config, _ = budgeted
    month = month_of(time.time())
    app = create_app(load_checked(config), redis_server_url, enqueue=lambda run_id: None)
    with closing(TestClient(app)) as client:
        reply = client.get("/admin/training/api/budget", headers={"X-API-Key": ADMIN_KEY})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["month"] == month
    assert [(c["scope"], c["unit"], c["used"], c["left"]) for c in body["caps"]] == [
        ("project", "gpu_hours", 2.0, 0.5),
        ("local", "kwh", 0.2, 0.3),
    ]
    assert body["caps"][1]["said"] == f"backend local: 0.2 of 0.5 kWh used in {month_words(month)}, 0.3 left"
    out = run_cli("training", "check", "local", config)
    assert f"budget: the project: 2 of 2.5 GPU-hours used in {month_words(month)}, 0.5 left" in out.stdout


@pytest.mark.unit
def test_an_estimate_counts_cpu_runs_as_no_gpu_and_energy_only_where_measured() -> None:
    cpu = {"gpus": [], "why": "CPU only"}
    ended = {"state": "succeeded"}
    recent = [
        {"trainer": "t", "backend": "b", "state": "running", "gpu_usage": HOUR},  # in flight: part of its use
        {"trainer": "t", "backend": "b", "gpu_usage": cpu, **ended},
        {"trainer": "t", "backend": "other", "gpu_usage": HOUR, **ended},
        {
            "trainer": "t",
            "backend": "b",
            "gpu_usage": {"gpus": ["0", "1"], "gpu_seconds": 7200.0, "energy_wh": None},
            **ended,
        },
    ]
    guess = estimate(recent, "t", "b", None)
    assert (guess.gpu_hours, guess.kwh, guess.basis) == (1.0, 0.0, "the mean of the last 2 t runs on b")
    none = estimate([], "t", "b", None)
    assert (none.gpu_hours, none.basis) == (
        0.0,
        "nothing: no t run on b reported its use yet, and max_wall_seconds is not set",
    )
    assert caps(BudgetConfig(kwh_per_month=3, backends={"b": {"gpu_hours_per_month": 9}})) == [
        Cap("kwh", 3, None),
        Cap("gpu_hours", 9, "b"),
    ]


LEGACY = {"gpus": ["0"], "gpu_seconds": 1e308, "energy_wh": 1e308}  # what an agent could record before issue 51


def test_a_struck_runs_use_counts_toward_no_budget_and_the_strike_is_recorded(
    tmp_path: Path, redis_server_url: str
) -> None:
    """A run whose record holds use no run could have (an agent's 1e308 GPU-seconds, recorded before the bounds)
    locks the project out; the admin strikes it from the command line, and the project runs again. The API
    answers the same strike; what cannot be struck is refused with the fix."""
    config = make_project(tmp_path, max_wall_seconds=7200, budget={"gpu_hours_per_month": 3.5})
    cfg = load_checked(config)
    store = RunStore(cfg, redis.Redis.from_url(redis_server_url))
    spent(store, new_run_id(datetime.now(timezone.utc) - timedelta(days=120)), {"gpus": ["0"], "gpu_seconds": 7000.0})
    spent(store)
    spent(store)
    bad = spent(store, usage=LEGACY)
    service = RunService(cfg, store, enqueue=lambda run_id: None)
    with pytest.raises(Conflict) as refused:
        service.submit(trainer="majority-baseline", schemas=["sentiment"])
    # The outlier (past max_wall_seconds on its GPU) and the run of four months ago are no part of the estimate.
    assert "2.78e+304 of 3.5 GPU-hours used" in refused.value.message
    assert "estimated at 1 GPU-hours (the mean of the last 2 majority-baseline runs on local)" in refused.value.message

    out = run_cli("training", "budget", config, "--strike", bad, "--reason", "the host sent 1e308 GPU-seconds")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{bad}: its GPU use (2.78e+304 GPU-hours, 1e+305 kWh) counts toward no budget now" in out.stdout
    assert "budget: the project: 2 of 3.5 GPU-hours used" in out.stdout
    assert store.read(bad)["usage_struck"]["reason"] == "the host sent 1e308 GPU-seconds"
    assert "was struck from the budget of " in store.paths(bad).run_log.read_text()
    assert service.submit(trainer="majority-baseline", schemas=["sentiment"])["state"] == RunState.QUEUED

    again = run_cli("training", "budget", config, "--strike", bad, "--reason", "twice")
    assert again.returncode == 1 and f"Run {bad}'s GPU use was struck already" in again.stderr
    no_reason = run_cli("training", "budget", config, "--strike", store.run_ids()[1])
    assert no_reason.returncode == 1 and "A strike needs its reason" in no_reason.stderr
    _strike_over_the_api(cfg, redis_server_url, store)


def _strike_over_the_api(cfg: Any, redis_url: str, store: RunStore) -> None:
    from fastapi.testclient import TestClient

    from potato_queue.server.app import create_app

    ended = store.run_ids()[1]
    queued = store.run_ids()[-1]  # the run submitted above: not ended
    with closing(TestClient(create_app(cfg, redis_url, enqueue=lambda run_id: None))) as client:

        def strike(run_id: str) -> Any:
            path = f"/admin/training/api/runs/{run_id}/strike_usage"
            return client.post(path, json={"reason": "a test run"}, headers={"X-API-Key": ADMIN_KEY})

        reply = strike(ended)
        assert reply.status_code == 200 and reply.json()["usage_struck"]["gpu_hours"] == 1.0, reply.text
        refused = strike(queued)
        assert refused.status_code == 409 and "only an ended run's use can be struck" in refused.text
        assert "usage_struck" not in store.read(queued)
