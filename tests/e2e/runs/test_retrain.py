"""Auto-retrain (API-5): real Redis, real executors, real `potato-queue beat` processes.

decide() is pure and gets its own table; the rest runs the beat's ticks through
Celery into the executors, with the annotations written into Potato's own
user_state.json as an annotator's session would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from potato_queue.config import AutoRetrainConfig
from potato_queue.runs.retrain import Baseline, decide
from tests.lifecycle_helpers import TERMINAL, Services, make_project

RETRAIN = {
    "enabled": True,
    "trainer": "majority-baseline",
    "schemas": ["sentiment"],
    "update_frequency": 5,
    "min_interval_s": 0,
}


@pytest.mark.parametrize(
    ("settings", "annotations", "baseline", "busy", "start", "reason"),
    [
        ({"enabled": False}, 100, Baseline(), None, False, "auto-retrain is off (model_training.auto_retrain.enabled)"),
        (
            {"enabled": True},
            100,
            Baseline(),
            ("r1", "running"),
            False,
            "run r1 is running; auto-retrain waits until it ends",
        ),
        (
            {"enabled": True},
            118,
            Baseline(100, "r0", 0.0),
            None,
            False,
            "waiting for 7 more annotations (18 of 25 since the last auto run)",
        ),
        (
            {"enabled": True, "min_interval_s": 600},
            130,
            Baseline(100, "r0", 1000.0),
            None,
            False,
            "waiting 500 s more: min_interval_s is 600 s since the last auto run (r0); 30 new annotations are ready",
        ),
        ({"enabled": True}, 125, Baseline(100, "r0", 0.0), None, True, "25 new annotations since the last auto run"),
        ({"enabled": True}, 30, Baseline(), None, True, "30 new annotations and no auto run yet"),
        (
            {"enabled": True},
            40,
            Baseline(100, "r0", 0.0),
            None,
            False,  # an annotator's folder was removed
            "waiting for 25 more annotations (0 of 25 since the last auto run)",
        ),
    ],
)
def test_decide(
    settings: dict[str, Any],
    annotations: int,
    baseline: Baseline,
    busy: tuple[str, str] | None,
    start: bool,
    reason: str,
) -> None:
    decision = decide(AutoRetrainConfig(**settings), annotations, baseline, busy, now_s=1100.0)
    assert (decision.start, decision.reason) == (start, reason)


def annotate(config: Path, n: int, user: str = "carol") -> None:
    """`n` more answers on items nobody labelled, saved the way Potato saves an annotator's state."""
    project = config.parent
    state_path = project / "annotation_output" / user / "user_state.json"
    state = (
        json.loads(state_path.read_text())
        if state_path.exists()
        else {"user_id": user, "instance_id_to_label_to_value": {}, "instance_id_to_span_to_value": {}}
    )
    labelled = set()
    for path in (project / "annotation_output").glob("*/user_state.json"):
        labelled |= set(json.loads(path.read_text())["instance_id_to_label_to_value"])
    items = [row["id"] for row in json.loads((project / "data" / "reviews.json").read_text())]
    for iid in [i for i in items if i not in labelled][:n]:
        state["instance_id_to_label_to_value"][iid] = [[{"schema": "sentiment", "name": "positive"}, "positive"]]
    state_path.parent.mkdir(exist_ok=True)
    state_path.write_text(json.dumps(state))


def auto_runs(svc: Services) -> list[dict[str, Any]]:
    status, runs = svc.api("GET", "/runs")
    assert status == 200, runs
    return [r for r in runs if r["trigger"] == "auto"]


def wait_reason(svc: Services, text: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status, reply = svc.api("GET", "/auto_retrain")
        if text in str(reply.get("reason")):
            return reply
        assert time.monotonic() < deadline, (reply, svc.logs())
        time.sleep(0.2)


def wait_auto_runs(svc: Services, n: int, timeout_s: float = 90) -> list[dict[str, Any]]:
    """Until `n` auto runs exist and all have ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = auto_runs(svc)
        if len(runs) >= n and all(r["state"] in TERMINAL for r in runs):
            return runs
        assert time.monotonic() < deadline, (runs, svc.logs())
        time.sleep(0.2)


def beat(svc: Services, name: str = "beat") -> subprocess.Popen[str]:
    return svc._spawn("beat", str(svc.config), "--every-s", "0.5", name=name)


def training_runs(svc: Services) -> str:
    return subprocess.run(
        [sys.executable, "-m", "potato_queue.cli", "training", "runs", str(svc.config)],
        env=svc.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def test_auto_retrain_starts_after_enough_annotations_and_says_why_it_waits(
    tmp_path: Path, redis_server_url: str
) -> None:
    svc = Services(make_project(tmp_path, auto_retrain=RETRAIN), redis_server_url, tmp_path)
    try:
        svc.serve()
        svc.executor()
        ticker = beat(svc)
        # The example's 160 answers are all new to a project that never retrained: one run at once.
        runs = wait_auto_runs(svc, 1)
        assert len(runs) == 1, (runs, svc.logs())
        first = runs[0]
        assert first["state"] == "succeeded" and first["schemas"] == ["sentiment"], first
        wait_reason(svc, "waiting for 5 more annotations (0 of 5 since the last auto run)")
        annotate(svc.config, 3)
        reply = wait_reason(svc, "waiting for 2 more annotations (3 of 5 since the last auto run)")
        assert (reply["annotations"], reply["baseline"], reply["last_run_id"]) == (163, 160, first["run_id"]), reply
        listed = training_runs(svc)
        assert "auto-retrain: waiting for 2 more annotations (3 of 5" in listed, listed
        assert listed.splitlines()[0].split()[6] == "TRIGGER" and listed.splitlines()[1].split()[5] == "auto", listed

        # A restarted beat (Potato 2.12 forgets its baseline) starts nothing for the old annotations.
        ticker.terminate()
        ticker.wait(10)
        svc.api("POST", "/runs", {"trainer": "majority-baseline", "schemas": ["sentiment"]})  # by hand: not auto
        beat(svc, "beat2")
        time.sleep(3)
        wait_reason(svc, "waiting for 2 more annotations (3 of 5")
        assert len(auto_runs(svc)) == 1, (auto_runs(svc), svc.logs())

        annotate(svc.config, 2)
        runs = wait_auto_runs(svc, 2)
        assert len(runs) == 2 and runs[0]["state"] == "succeeded", runs
        wait_reason(svc, "waiting for 5 more annotations (0 of 5")
    finally:
        svc.stop()


def test_two_beats_and_two_executors_start_one_run(tmp_path: Path, redis_server_url: str) -> None:
    svc = Services(make_project(tmp_path, auto_retrain=RETRAIN), redis_server_url, tmp_path)
    try:
        svc.serve()
        svc.executor()
        svc.executor()
        beat(svc, "beat-a")
        beat(svc, "beat-b")
        wait_auto_runs(svc, 1)
        annotate(svc.config, 5)
        wait_auto_runs(svc, 2)
        time.sleep(4)  # eight more ticks of each beat: every one of them finds nothing new
        runs = auto_runs(svc)
        assert len(runs) == 2, runs
        wait_reason(svc, "waiting for 5 more annotations (0 of 5")
    finally:
        svc.stop()


def test_beat_refuses_a_project_without_auto_retrain(tmp_path: Path, redis_server_url: str) -> None:
    svc = Services(make_project(tmp_path), redis_server_url, tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "potato_queue.cli", "beat", str(svc.config)],
        env=svc.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert "auto-retrain is off in" in done.stderr and "model_training.auto_retrain.enabled: true" in done.stderr


def _check_at(barrier: Any, config_path: str, redis_url: str, started: Any) -> None:
    import redis

    from potato_queue.runs.retrain import check
    from potato_queue.store import RunStore
    from potato_queue.validate import load_checked

    config = load_checked(config_path)
    store = RunStore(config, redis.Redis.from_url(redis_url))
    store.index.unfinished()  # connected before the start
    barrier.wait()
    decision = check(config, store, enqueue=lambda run_id: None)
    if decision is not None and decision.start:
        started.put(decision.reason)


def test_checks_at_the_same_moment_start_one_run(tmp_path: Path, redis_server_url: str) -> None:
    """Eight checks released together (beats on several machines, executors taking their ticks at once),
    in eight processes: the lock lets one decide; the others find it held, or the run it queued."""
    import multiprocessing

    config = make_project(tmp_path, auto_retrain=RETRAIN)
    context = multiprocessing.get_context("fork")
    barrier, started = context.Barrier(8), context.Queue()
    procs = [
        context.Process(target=_check_at, args=(barrier, str(config), redis_server_url, started)) for _ in range(8)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0] * 8
    reasons = []
    while not started.empty():
        reasons.append(started.get())
    assert len(reasons) == 1, reasons
    runs = sorted((config.parent / "annotation_output" / "training" / "runs").iterdir())
    assert len(runs) == 1, runs


def test_beat_checks_once_at_its_start(tmp_path: Path, redis_server_url: str) -> None:
    """Its schedule's first tick is an interval away (an hour here): one check at start says where things stand."""
    svc = Services(
        make_project(tmp_path, auto_retrain={**RETRAIN, "update_frequency": 500}), redis_server_url, tmp_path
    )
    try:
        svc.serve()
        svc.executor()
        svc._spawn("beat", str(svc.config), "--every-s", "3600", name="beat")
        wait_reason(svc, "waiting for 340 more annotations (160 of 500 since the last auto run)", timeout_s=60)
    finally:
        svc.stop()


def test_a_project_whose_auto_retrain_is_potatos_gets_no_beat(tmp_path: Path, redis_server_url: str) -> None:
    """trainer potato-queue-remote: Potato's own server schedules (its runs queue here), so beat refuses."""
    from tests.conftest import run_cli

    remote = {
        "enabled": True,
        "trainer": "potato-queue-remote",
        "schemas": ["sentiment"],
        "params": {"trainer": "sklearn-text", "backend": "local"},
    }
    svc = Services(make_project(tmp_path, auto_retrain=remote), redis_server_url, tmp_path)
    checked = run_cli("validate", svc.config, "--strict")
    assert "names both a trainer" not in checked.stdout, checked.stdout
    done = subprocess.run(
        [sys.executable, "-m", "potato_queue.cli", "beat", str(svc.config)],
        env=svc.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert (
        "auto-retrain of this project is Potato's: model_training.auto_retrain.trainer is potato-queue-remote"
        in done.stderr
        and "do not run beat for this project" in done.stderr
    )
    listed = run_cli("training", "runs", svc.config, env=svc.env)
    assert "auto-retrain: Potato's own server schedules it (trainer potato-queue-remote)" in listed.stdout, listed


@pytest.mark.parametrize("schemas", [["sentiment"], None])
def test_validate_warns_when_potatos_scheduler_would_act_too(tmp_path: Path, schemas: list[str] | None) -> None:
    """Potato 2.12 acts on model_training.auto_retrain when it names a trainer and schemas."""
    from tests.conftest import run_cli

    retrain = {**RETRAIN, "schemas": schemas} if schemas else {k: v for k, v in RETRAIN.items() if k != "schemas"}
    checked = run_cli("validate", make_project(tmp_path, auto_retrain=retrain))
    warned = (
        "warning: model_training.auto_retrain names both a trainer (majority-baseline) and schemas, so "
        "Potato's own server retrains on it too"
    ) in checked.stdout
    assert checked.returncode == 0 and warned == bool(schemas), checked.stdout
