"""A run's whole life on the local backend: real Redis, real server, real executors, real agent and worker."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lifecycle_helpers import (
    TERMINAL,
    Services,
    alive_cmd,
    held_run,
    make_project,
    processes_of,
    run_paths,
    session_of,
    started,
    wait_running,
    wait_until,
)


@pytest.fixture
def services(tmp_path: Path, redis_server_url: str) -> Iterator[Services]:
    with started(tmp_path, redis_server_url, executors=0, grace_seconds=2) as svc:
        yield svc


def test_sklearn_run_succeeds_with_held_out_scores_and_predictions(services: Services) -> None:
    services.executor()
    run_id = services.start_run(trainer="sklearn-text", schemas=["sentiment"])
    run = services.wait_for(run_id, {"succeeded", "failed", "cancelled"})
    assert run["state"] == "succeeded", (run, services.logs())
    assert run["ran_on"] == "local"
    for split in ("val", "test"):
        scores = run["held_out"]["sentiment"][split]
        assert scores["n"] > 0 and 0.0 <= scores["accuracy"] <= 1.0 and 0.0 <= scores["macro_f1"] <= 1.0
    run_dir = run_paths(services, run_id).dir
    lines = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    assert lines and set(lines[0]) == {"instance_id", "schema_name", "payload", "confidence", "scores"}
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
    status, reply = services.api(
        "POST", "/runs", {"trainer": "sklearn-text", "schemas": ["sentiment"], "backend": "gpu"}
    )
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


# ---------------------------------------------------------------- hf-text-classification, cancel, limits


def test_hf_run_succeeds_through_the_queue(services: Services, tiny_model: Path) -> None:
    services.executor()
    run_id = services.start_run(
        trainer="hf-text-classification",
        schemas=["sentiment"],
        params={"model_name": str(tiny_model), "epochs": 1, "batch_size": 16},
    )
    run = services.wait_for(run_id, TERMINAL, timeout_s=180)
    assert run["state"] == "succeeded", (run, services.logs())
    assert run["held_out"]["sentiment"]["test"]["n"] > 0
    assert any(key.startswith("train/loss") for key in run["metrics"])


def test_kill_9_of_the_executor_fails_the_run_by_the_sweep_and_the_next_proceeds(services: Services) -> None:
    """With nothing queued, only the new executor's background sweep can notice the run left in flight;
    the next run then goes. (The rule itself, to the second: tests/unit/test_recovery.py.)"""
    import os
    import signal

    first = services.executor()
    long_run = held_run(services)
    wait_running(services, long_run)
    os.kill(first.pid, signal.SIGKILL)
    services.executor()
    run = services.wait_for(long_run, TERMINAL, timeout_s=90)
    assert run["state"] == "failed"
    assert run["error"].startswith("The executor supervising this run stopped")
    assert processes_of(long_run, run_paths(services, long_run).dir) == []
    next_run = services.start_run(trainer="sklearn-text", schemas=["sentiment"])
    assert services.wait_for(next_run, TERMINAL, timeout_s=90)["state"] == "succeeded"


def test_flushdb_with_runs_queued_requeues_them_from_disk_once(tmp_path: Path) -> None:
    import tempfile

    import redis

    from potato_queue.processes.embedded_redis import EmbeddedRedis

    # A Redis of this test's own: the flush must never reach one that other tests (or anyone) share.
    with (
        tempfile.TemporaryDirectory() as folder,
        EmbeddedRedis(folder) as own,
        started(tmp_path, own.url, executors=0, grace_seconds=2) as services,
    ):
        ids = [services.start_run(trainer="sklearn-text", schemas=["sentiment"]) for _ in range(2)]
        with redis.Redis.from_url(own.url) as client:
            client.flushdb()
        services.executor()
        runs = [services.wait_for(i, TERMINAL, timeout_s=120) for i in ids]
    assert [r["state"] for r in runs] == ["succeeded", "succeeded"]
    for run_id in ids:
        log = run_paths(services, run_id).run_log.read_text()
        # prepared once each: the second run copies the first's bundle (the same inputs)
        assert len(re.findall(r"bundle (built|of run \S+ reused)", log)) == 1, log


def test_run_longer_than_the_visibility_timeout_runs_once(services: Services) -> None:
    # The Redis transport delivers an unacked message again after the visibility timeout
    # (shortened to 1 s here); the second executor must not start the run a second time.
    env = {"POTATO_QUEUE_VISIBILITY_TIMEOUT_S": "1"}
    services.executor(env)
    services.executor(env)
    # Several visibility timeouts long (held: what runs inside does not matter to the broker).
    run_id = services.start_run(trainer="majority-baseline", schemas=["sentiment"], params={"hold_s": 5})
    run = services.wait_for(run_id, TERMINAL, timeout_s=240)
    assert run["state"] == "succeeded", services.logs()

    def executor_logs() -> str:
        return "".join(p.read_text() for p in services.tmp_path.glob("executor*.log"))

    # An executor prints "ran" after the run's end is recorded (and Celery acks after that).
    wait_until(lambda: f"ran {run_id}" in executor_logs(), 30, "the executor's 'ran' line")
    logs = executor_logs()
    assert logs.count(f"woken for run {run_id}") >= 2, "the message was never delivered again: " + logs
    assert logs.count(f"ran {run_id}") == 1
    run_log = run_paths(services, run_id).run_log.read_text()
    assert run_log.count("bundle built") == 1


def test_decision_calibrate_recalibrates_the_latest_run_and_is_local_only(
    tmp_path: Path, redis_server_url: str
) -> None:
    config = make_project(tmp_path, grace_seconds=2, backends={"workstation": {"type": "agent"}})
    svc = Services(config, redis_server_url, tmp_path)
    svc.serve()
    try:
        status, reply = svc.api(
            "POST", "/runs", {"trainer": "decision-calibrate", "schemas": ["sentiment"], "backend": "workstation"}
        )
        assert status == 400 and "runs only on the local backend" in reply["detail"]
        svc.executor()
        base = svc.start_run(trainer="sklearn-text", schemas=["sentiment"])
        assert svc.wait_for(base, TERMINAL)["state"] == "succeeded"
        calibrated = svc.start_run(trainer="decision-calibrate", schemas=["sentiment"])
        run = svc.wait_for(calibrated, TERMINAL)
        assert run["state"] == "succeeded", (run, svc.logs())
        assert run["held_out"]["sentiment"]["test"]["n"] > 0
        runs_dir = config.parent / "annotation_output/training/runs"

        def predictions(run_id: str) -> dict[str, tuple[str, float]]:
            lines = (runs_dir / run_id / "predictions.jsonl").read_text().splitlines()
            return {
                json.loads(x)["instance_id"]: (json.loads(x)["payload"]["label"], json.loads(x)["confidence"])
                for x in lines
            }

        before, after = predictions(base), predictions(calibrated)
        assert set(after) <= set(before) and after
        assert all(after[i][0] == before[i][0] for i in after), "calibration must not change labels"
        assert any(after[i][1] != before[i][1] for i in after), "calibration changed no confidence"
    finally:
        svc.stop()


def test_max_ram_mb_ends_the_run_with_an_out_of_memory_message(
    tmp_path: Path, redis_server_url: str, tiny_model: Path
) -> None:
    # Importing torch alone takes well over 60 MB of resident memory.
    with started(tmp_path, redis_server_url, grace_seconds=2, max_ram_mb=60) as svc:
        run_id = svc.start_run(
            trainer="hf-text-classification", schemas=["sentiment"], params={"model_name": str(tiny_model), "epochs": 1}
        )
        run = svc.wait_for(run_id, TERMINAL, timeout_s=60)
        assert (run["state"], run["exit_code"]) == ("failed", 5), run
        assert "out of memory" in run["error"] and "max_ram_mb" in run["error"], run["error"]
        assert processes_of(run_id, run_paths(svc, run_id).dir) == []


def test_missing_device_falls_back_with_a_warning_in_run_log(
    tmp_path: Path, redis_server_url: str, tiny_model: Path
) -> None:
    # This machine has no GPU, so cuda:1 does not exist here (LOC-1).
    with started(tmp_path, redis_server_url, device="cuda:1") as svc:
        run_id = svc.start_run(
            trainer="hf-text-classification", schemas=["sentiment"], params={"model_name": str(tiny_model), "epochs": 1}
        )
        assert svc.wait_for(run_id, TERMINAL, timeout_s=120)["state"] == "succeeded"
        log = run_paths(svc, run_id).run_log.read_text()
        assert "Device 'cuda:1' is not available on this machine (available: cpu); using cpu instead" in log, log


def test_a_warm_agent_never_assigned_leaves_nothing_behind() -> None:
    """The local backend's pre-started agent (and the worker it pre-starts) exit when their executor goes."""
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    agent = subprocess.Popen(
        [sys.executable, "-S", "-m", "potato_queue.agent", "run", "--assignment-on-stdin"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=str(ROOT),
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    worker = []
    while not worker and time.monotonic() < deadline:
        worker = [
            p
            for p in Path("/proc").iterdir()
            if p.name.isdigit()
            and session_of(p.name) == agent.pid
            and "--spec-on-stdin" in (alive_cmd(int(p.name)) or "")
        ]
        time.sleep(0.05)
    assert worker, "the warm agent did not pre-start a worker"
    assert agent.stdin is not None
    agent.stdin.close()  # the executor is gone
    assert agent.wait(timeout=30) == 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and alive_cmd(int(worker[0].name)):
        time.sleep(0.05)
    assert not alive_cmd(int(worker[0].name))


def test_a_run_for_a_backend_the_executors_config_lacks_fails_at_once_saying_why(services: Services) -> None:
    """The config gained a backend after the executor started (here: a run written for one it lacks)."""
    import redis

    from potato_queue.processes.queue import enqueue, make_celery
    from potato_queue.store import RunStore
    from potato_queue.validate import load_checked

    services.executor()
    config = load_checked(services.config)
    store = RunStore(config, redis.Redis.from_url(services.redis_url))
    run_id = store.create(trainer="sklearn-text", schemas=["sentiment"], backend="gpu-two")["run_id"]
    enqueue(make_celery(config, services.redis_url), config, run_id)
    run = services.wait_for(run_id, TERMINAL, timeout_s=60)
    assert run["state"] == "failed"
    assert run["error"].startswith(
        f"This executor runs {services.config.resolve()} as it was when the executor "
        "started, and that has no backend 'gpu-two' (configured: local)"
    ), run["error"]
    assert "restart them (potato-queue executor CONFIG)" in run["error"]
    next_run = services.start_run(trainer="sklearn-text", schemas=["sentiment"])  # the queue goes on
    assert services.wait_for(next_run, TERMINAL)["state"] == "succeeded"


def test_cancelling_a_finished_run_says_it_had_already_finished(services: Services) -> None:
    from tests.conftest import run_cli

    services.executor()
    run_id = services.start_run(trainer="majority-baseline", schemas=["sentiment"])
    assert services.wait_for(run_id, TERMINAL)["state"] == "succeeded"
    status, reply = services.api("POST", f"/runs/{run_id}/cancel")
    assert (
        status == 409
        and reply["detail"] == f"run {run_id} had already finished (succeeded); there is nothing to cancel"
    )
    proc = run_cli("training", "cancel", run_id, services.config)
    assert proc.returncode == 1
    assert f"run {run_id} had already finished (succeeded); there is nothing to cancel" in proc.stderr
    assert services.api("GET", f"/runs/{run_id}")[1]["state"] == "succeeded"


def test_a_data_item_that_is_not_valid_unicode_is_named_and_the_run_goes_on(
    tmp_path: Path, redis_server_url: str
) -> None:
    config = make_project(tmp_path, grace_seconds=2)
    data = config.parent / "data" / "reviews.json"
    items = json.loads(data.read_text())
    bad_id = items[3]["id"]
    # A lone surrogate, as a JSON escape: it parses, and cannot be written as UTF-8.
    data.write_text(json.dumps(items).replace(json.dumps(items[3]["text"]), '"broken \\ud800 text"', 1))
    svc = Services(config, redis_server_url, tmp_path)
    svc.serve()
    try:
        svc.executor()
        run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"])
        run = svc.wait_for(run_id, TERMINAL)
        assert run["state"] == "succeeded", (run, svc.logs())
        log = run_paths(svc, run_id).run_log.read_text()
        assert "1 item(s) hold text that is not valid Unicode" in log and bad_id in log, log
    finally:
        svc.stop()


def test_bad_predictions_are_refused_and_named_and_never_reach_potato(tmp_path: Path, redis_server_url: str) -> None:
    """What an agent or a host sends back is checked against the run's own bundle: lines that are not a
    prediction are skipped, an unknown item, a foreign label (a lone surrogate included) or a confidence
    that is not a number in [0, 1] are refused and named; a good one is stored in Potato's store and
    published."""
    import redis
    from potato.training import store as potato_store

    from potato_queue.bundle import build_bundle
    from potato_queue.runs.finalize import finalize_predictions
    from potato_queue.store import RunStore
    from potato_queue.store.potato_ledger import potato_config
    from potato_queue.validate import load_checked

    config = load_checked(make_project(tmp_path, writeback={"schemas": ["sentiment"], "include_unlabeled": True}))
    store = RunStore(config, redis.Redis.from_url(redis_server_url))
    record = store.create(trainer="sklearn-text", schemas=["sentiment"], backend="local")
    paths = store.paths(record["run_id"])
    build_bundle(config, paths.bundle_dir, ["sentiment"])
    unlabeled = [
        json.loads(line)["instance_id"] for line in (paths.bundle_dir / "unlabeled.jsonl").read_text().splitlines()
    ]

    def pred(item: str, label: str, confidence: Any) -> str:
        return json.dumps(
            {
                "instance_id": item,
                "schema_name": "sentiment",
                "payload": {"label": label, "confidence": confidence},
                "confidence": confidence,
            }
        )

    lines = [
        "[1, 2]",
        pred(unlabeled[0], "positive", 0.9),
        "not json",
        pred("r999-nowhere", "positive", 0.9),
        pred(unlabeled[1], "pos\ud800", 0.9),
        pred(unlabeled[2], "negative", "true"),
        pred(unlabeled[3], "negative", 1.5),
    ]
    paths.predictions.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    _, prelabels = finalize_predictions(config, store, record)
    assert (prelabels["published"], prelabels["predictions"], prelabels["refused"]) == (1, 1, 4)
    log = paths.run_log.read_text()
    assert "predictions.jsonl has 2 line(s) that are not a prediction" in log and "line(s) 1, 3" in log, log
    assert "refused 4 prediction(s), never stored or published" in log, log
    assert "('r999-nowhere', 'sentiment'): the item is not in the run's bundle" in log
    assert (
        f"('{unlabeled[1]}', 'sentiment'): label 'pos\ufffd' is not one of the schema's labels (negative, positive)"
        in log
    )
    assert f"('{unlabeled[2]}', 'sentiment'): confidence 'true' is not a number in [0, 1]" in log
    assert f"('{unlabeled[3]}', 'sentiment'): confidence 1.5 is not a number in [0, 1]" in log
    published = (config.output_path / "training" / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["instance_id"] for line in published] == [unlabeled[0]]
    stored = potato_store.load_predictions(potato_config(config), run_id=record["run_id"])
    assert [p["instance_id"] for p in stored] == [unlabeled[0]]
    assert [p.name for p in (config.output_path / "training").iterdir() if p.name.startswith(".")] == []


def test_retain_runs_prunes_old_bundles_and_models_but_never_the_latest_success(
    tmp_path: Path, redis_server_url: str
) -> None:
    with started(tmp_path, redis_server_url, retain_runs=1, grace_seconds=2) as svc:

        def fail() -> str:  # its model folder does not exist
            run_id = svc.start_run(
                trainer="hf-text-classification",
                schemas=["sentiment"],
                params={"model_name": str(tmp_path / "no-such-model")},
            )
            assert svc.wait_for(run_id, TERMINAL, timeout_s=120)["state"] == "failed"
            return run_id

        first = svc.start_run(trainer="sklearn-text", schemas=["sentiment"])
        assert svc.wait_for(first, TERMINAL)["state"] == "succeeded"
        failed = fail()
        later = [svc.start_run(trainer="majority-baseline", schemas=["sentiment"]) for _ in range(2)]
        for run_id in later:
            assert svc.wait_for(run_id, TERMINAL)["state"] == "succeeded"
        failed_again = fail()
        # The newest success and the newest failure keep theirs (a retry trains on its bundle); `first` is no
        # longer the latest success.
        kept, pruned = [later[-1], failed_again], [failed, later[0], first]
        # The executor prunes in a thread of its own once a run has ended: wait for the lines it writes.
        for run_id in pruned:
            wait_until(
                lambda run_id=run_id: (
                    "retain_runs keeps those of the newest 1 succeeded runs and the newest "
                    "1 others" in run_paths(svc, run_id).run_log.read_text()
                )
            )
            paths = run_paths(svc, run_id)
            assert not paths.bundle.exists() and not paths.artifacts.exists() and paths.run_json.exists()
            assert "bundle and model files removed" in paths.run_log.read_text()
        assert all(run_paths(svc, run_id).bundle.exists() for run_id in kept)


def test_cancelled_runs_never_push_out_the_files_of_succeeded_ones(tmp_path: Path, redis_server_url: str) -> None:
    """Forty cancelled retries after two successes, retain_runs=2: both successes keep their model files,
    and of the cancelled runs only the newest two keep their bundles."""
    import redis

    from potato_queue.run import RunState
    from potato_queue.runs.retention import prune_old_runs
    from potato_queue.store import RunStore
    from potato_queue.store.records import created_ms
    from potato_queue.validate import load_checked

    store = RunStore(load_checked(make_project(tmp_path, retain_runs=2)), redis.Redis.from_url(redis_server_url))

    def ended(state: RunState) -> str:
        run_id = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")["run_id"]
        paths = store.paths(run_id)
        paths.bundle.write_bytes(b"bundle")
        store.index.mark_bulky(run_id, created_ms(store.read(run_id)))
        if state == RunState.SUCCEEDED:
            paths.artifacts.mkdir()
            (paths.artifacts / "model.bin").write_bytes(b"model")
            for step in (RunState.RUNNING, RunState.COLLECTING):
                assert store.transition(run_id, step) is not None
        assert store.transition(run_id, state) is not None
        return run_id

    succeeded = [ended(RunState.SUCCEEDED) for _ in range(2)]
    made = [ended(RunState.CANCELLED) for _ in range(40)]
    cancelled = [r for r in store.index.bulky_runs() if r in made]  # by age, as retain_runs sees them
    pruned = prune_old_runs(store, 2)
    assert pruned == cancelled[:-2]
    assert all((store.paths(r).artifacts / "model.bin").exists() for r in succeeded)
    assert [r for r in cancelled if store.paths(r).bundle.exists()] == cancelled[-2:]
    assert prune_old_runs(store, 2) == []


def test_hf_with_no_hub_fails_at_once_saying_the_model_is_not_cached(tmp_path: Path, redis_server_url: str) -> None:
    # The hub's address here refuses connections (port 9 on loopback), as no hub answers a closed network.
    with started(tmp_path, redis_server_url, executors=0, grace_seconds=2) as svc:
        svc.executor(env={"HF_ENDPOINT": "http://127.0.0.1:9"})
        run_id = svc.start_run(
            trainer="hf-text-classification",
            schemas=["sentiment"],
            params={"model_name": "some-lab/a-model-nobody-cached", "epochs": 1},
        )
        run = svc.wait_for(run_id, TERMINAL, timeout_s=120)
        assert run["state"] == "failed"
        assert run["error"].startswith(
            "Model 'some-lab/a-model-nobody-cached' is not in this machine's Hugging Face "
            "cache, and the hub (127.0.0.1) does not answer from here"
        ), run["error"]
        assert (
            "fix: download it where the hub answers (huggingface-cli download some-lab/a-model-nobody-cached)"
            in run["error"]
        )
        log = run_paths(svc, run_id).run_log.read_text()
        assert "the model hub (127.0.0.1) does not answer from here" in log and "Traceback" not in log, log


def test_a_server_stopped_during_a_run_and_two_agent_claims_stops_at_once_and_quietly(
    tmp_path: Path, redis_server_url: str
) -> None:
    """The local run's agent waits in its control long-poll, two agents of an agent backend wait for a run
    (the first in the claim route, the second at the door in front of it): SIGTERM answers them all (the
    claims with "no run") and the server exits 0 with no ERROR and no traceback in its output."""
    import signal
    import threading
    import time
    import urllib.request

    import redis

    from potato_queue.store.keys import Keys
    from tests.agent_helpers import BACKEND, lab, register

    with started(tmp_path, redis_server_url, grace_seconds=2, **lab()) as svc:
        token = register(svc)
        run_id = svc.start_run(
            trainer="majority-baseline", schemas=["sentiment"], backend="local", params={"hold_s": 60}
        )
        wait_running(svc, run_id)
        registered = Keys.of(svc.project_config).agent_token(BACKEND)
        client = redis.Redis.from_url(redis_server_url)
        answers: list[tuple[int, Any]] = []

        def claim(pid: int) -> None:
            req = urllib.request.Request(
                f"{svc.url}/api/training/agent/v1/backends/{BACKEND}/claim?wait_s=90",
                data=json.dumps({"pid": pid}).encode(),
                method="POST",
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=120) as resp:
                answers.append((resp.status, json.loads(resp.read())))

        claims = [threading.Thread(target=claim, args=(pid,)) for pid in (1, 2)]
        claims[0].start()
        wait_until(
            lambda: json.loads(client.hget(registered, "agent") or b"{}").get("pid") == 1, 30, "the first claim looked"
        )
        claims[1].start()
        # Nothing outside the server shows the second claim waiting at the door: give its request a moment to
        # arrive whole, or the stopping server would close its connection as idle instead of answering it.
        time.sleep(0.5)
        server = svc.procs[0]
        server.send_signal(signal.SIGTERM)
        assert server.wait(15) in (0, -signal.SIGTERM)  # uvicorn raises the signal again once it has stopped
        for thread in claims:
            thread.join(15)
        assert answers == [(200, {"run_id": None, "token": None, "drain": False})] * 2, answers
        said = (svc.tmp_path / "server.log").read_text()
        assert "ERROR" not in said and "Traceback" not in said, said
