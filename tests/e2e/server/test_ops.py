"""/metrics and /healthz against a real server, executor and Redis; /metrics read with prometheus_client's parser."""

from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request
from contextlib import closing
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from potato_queue.server.ops import render_metrics
from potato_queue.validate import load_checked
from tests.agent_helpers import lab, register
from tests.lifecycle_helpers import ADMIN_KEY, TERMINAL, Services, make_project, started
from tests.sshd import free_port


def get(svc: Services, path: str, **headers: str) -> tuple[int, str]:
    request = urllib.request.Request(svc.url + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def samples(text: str) -> dict[str, list[Any]]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_metrics_count_the_runs_by_state_and_backend(tmp_path: Path, redis_server_url: str) -> None:
    with started(tmp_path, redis_server_url, **lab()) as svc:
        register(svc)
        done = [svc.start_run(trainer="majority-baseline", schemas=["sentiment"]) for _ in range(2)]
        for run_id in done:
            assert svc.wait_for(run_id, TERMINAL)["state"] == "succeeded"
        waiting = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend="lab")
        deadline = time.monotonic() + 30
        while svc.api("GET", f"/runs/{waiting}")[1].get("step") != "waiting for an agent on lab":  # no agent runs
            assert time.monotonic() < deadline, svc.api("GET", f"/runs/{waiting}")[1]
            time.sleep(0.1)
        assert get(svc, "/metrics")[0] == 401
        status, text = get(svc, "/metrics", **{"X-API-Key": ADMIN_KEY})
        assert status == 200
        found = samples(text)
        runs = {(s.labels["state"], s.labels["backend"]): s.value for s in found["potato_queue_runs"]}
        assert runs[("succeeded", "local")] == 2 and runs[("queued", "lab")] == 1
        assert sum(runs.values()) == len(svc.api("GET", "/runs")[1]) == 3
        durations = {
            s.name: s.value for s in found["potato_queue_run_duration_seconds"] if s.labels["backend"] == "local"
        }
        assert durations["potato_queue_run_duration_seconds_count"] == 2
        assert durations["potato_queue_run_duration_seconds_sum"] > 0
        assert [s.value for s in found["potato_queue_queue_length"]] == [0]
        assert [s.value for s in found["potato_queue_executors"]] == [1]
        assert "potato_queue_agent_last_seen_age_seconds" in found  # no agent has asked yet: no sample
        assert found["potato_queue_agent_last_seen_age_seconds"] == []


def test_a_scrape_token_opens_metrics_and_nothing_else(tmp_path: Path, redis_server_url: str) -> None:
    with started(tmp_path, redis_server_url, executors=0) as svc:
        svc.stop()
        svc.procs.clear()
        svc.env["POTATO_QUEUE_METRICS_TOKEN"] = "scrape-token-for-tests"
        svc.serve()
        assert get(svc, "/metrics", Authorization="Bearer scrape-token-for-tests")[0] == 200
        assert get(svc, "/metrics", Authorization="Bearer wrong")[0] == 401
        assert get(svc, "/admin/training/api/runs", Authorization="Bearer scrape-token-for-tests")[0] == 401


def test_healthz_says_when_no_executor_is_up(tmp_path: Path, redis_server_url: str) -> None:
    with started(tmp_path, redis_server_url, executors=0) as svc:
        status, body = get(svc, "/healthz")
        assert status == 503 and '"executors":0' in body and "start one (potato-queue executor CONFIG)" in body
        executor = svc.executor()
        deadline = time.monotonic() + 60
        while get(svc, "/healthz")[0] != 200:
            assert time.monotonic() < deadline, get(svc, "/healthz")
            time.sleep(0.2)
        assert '"executors":1' in get(svc, "/healthz")[1]
        os.killpg(executor.pid, signal.SIGKILL)  # no goodbye: its key expires
        deadline = time.monotonic() + 30
        while get(svc, "/healthz")[0] != 503:
            assert time.monotonic() < deadline
            time.sleep(0.5)


def test_healthz_says_redis_does_not_answer_and_not_where_it_is(tmp_path: Path) -> None:
    # /healthz answers anyone: the server's Redis URL (host, port, password) is not theirs to read.
    from fastapi.testclient import TestClient

    from potato_queue.server.app import create_app

    port = free_port()  # nothing listens there
    app = create_app(
        load_checked(make_project(tmp_path)), f"redis://:hunter2-secret@127.0.0.1:{port}/0", enqueue=lambda run_id: None
    )
    with closing(TestClient(app)) as client:  # not `with TestClient`: ClaimDoor takes no lifespan scope
        reply = client.get("/healthz")
    assert reply.status_code == 503
    body = reply.json()
    assert (body["ok"], body["redis"], body["executors"]) == (False, "does not answer", None)
    assert body["problem"].startswith("Redis does not answer: start it, or restart the server with one that runs")
    assert not [leak for leak in ("hunter2", str(port), "127.0.0.1", "redis://") if leak in reply.text], reply.text


def test_metrics_text_escapes_labels_and_ages_heartbeats() -> None:
    runs = [{"run_id": "r1", "state": "running", "backend": 'odd"name', "heartbeat_at": 990.0}]
    found = samples(render_metrics(runs, 3, {"lab": 900.0, "idle": None}, 2, now_s=1000.0))
    assert [(s.labels, s.value) for s in found["potato_queue_heartbeat_age_seconds"]] == [
        ({"run_id": "r1", "backend": 'odd"name'}, 10.0)
    ]
    assert [(s.labels, s.value) for s in found["potato_queue_agent_last_seen_age_seconds"]] == [
        ({"backend": "lab"}, 100.0)
    ]
    assert [s.value for s in found["potato_queue_queue_length"]] == [3]


def test_metrics_carry_the_gpu_hours_and_energy_of_the_runs_by_backend() -> None:
    runs = [
        {
            "run_id": "r1",
            "state": "succeeded",
            "backend": "lab",
            "gpu_usage": {"gpus": ["0"], "gpu_seconds": 5400.0, "energy_wh": 300.0},
        },
        {
            "run_id": "r2",
            "state": "running",
            "backend": "lab",
            "gpu_usage": {"gpus": ["0", "1"], "gpu_seconds": 1800.0, "energy_wh": None},
        },
        {"run_id": "r3", "state": "succeeded", "backend": "local", "gpu_usage": {"gpus": [], "why": "CPU only"}},
    ]
    found = samples(render_metrics(runs, 0, {}, 1, now_s=1000.0))
    assert [(s.labels, s.value) for s in found["potato_queue_gpu_hours"]] == [({"backend": "lab"}, 2.0)]
    assert [(s.labels, s.value) for s in found["potato_queue_gpu_energy_kwh"]] == [({"backend": "lab"}, 0.3)]
