"""What a run token's holder can put in the run's record (issue 21): only bounded values, whatever it sends.

The record is what every listing reads (GET /runs, the Training page's stream twice a second), so a
hostile or broken agent must not be able to make it large. Real server and executor (`potato-queue serve`,
`potato-queue executor`), a real Redis; the test plays the agent of an agent backend over HTTP, as an agent
with a claimed run's token could.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from potato_queue.bounds import MAX_LIVE_TEXT_CHARS
from potato_queue.lab.usage import MAX_GPU_WATTS
from tests.agent_helpers import BACKEND, lab, register
from tests.lifecycle_helpers import ADMIN_KEY, Services, run_paths, started

AGENT_API = "/api/training/agent/v1"
EIGHT_MB = 8 << 20
SMALL_BYTES = 64 << 10  # a run's record or the listing of one run: a few KB when honest


def agent_post(svc: Services, path: str, token: str, body: Any) -> tuple[int, Any]:
    """POST to the agent protocol with a bearer token: (status, the reply's JSON)."""
    request = urllib.request.Request(
        f"{svc.url}{AGENT_API}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


USAGE_FIGURES = ("gpu_seconds", "energy_wh", "mean_utilization_pct", "peak_memory_mb")


def assert_gpu_use_bounded(svc: Services, run: dict[str, Any], log: str) -> None:
    """An agent said its run used 1e308 GPU-seconds, Wh, % and MB (issue 51): each figure is refused; the
    GPU-seconds and energy count as the bound (the run did hold its GPU that long); the budget stays open."""
    usage = run["gpu_usage"]
    assert 60 <= usage["gpu_seconds"] < 600, usage  # one GPU for the run's seconds, with a minute's slack
    assert usage["energy_wh"] == pytest.approx(usage["gpu_seconds"] * MAX_GPU_WATTS / 3600, rel=1e-3)
    assert usage["mean_utilization_pct"] is None and usage["peak_memory_mb"] is None
    assert [line.split()[0] for line in usage["refused"]] == list(USAGE_FIGURES)
    assert "warning: the agent's GPU use was refused in part: gpu_seconds 1e+308 is over " in log
    figures, _, refused = run["gpu_use"].partition(" (refused from the agent: ")
    assert "e+30" not in figures and refused.startswith("gpu_seconds 1e+308 is over "), run["gpu_use"]
    status, budget = svc.api("GET", "/budget")
    assert status == 200 and budget["caps"][0]["used"] < 0.2, budget
    request = urllib.request.Request(f"{svc.url}/metrics", headers={"X-API-Key": ADMIN_KEY})
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert "e+30" not in reply.read().decode()
    assert svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)


def claim(svc: Services, backend_token: str) -> tuple[str, str]:
    """The offered run and its token, claimed as `potato-queue training agent` claims it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, reply = agent_post(svc, f"/backends/{BACKEND}/claim?wait_s=5", backend_token, {"host": "lab"})
        assert status == 200, reply
        if reply["run_id"]:
            return reply["run_id"], reply["token"]
    raise AssertionError(f"no run was offered to {BACKEND} within 60 s: {svc.logs()}")


def test_eight_mb_metrics_and_gpu_use_no_run_could_use_leave_the_record_small_and_the_budget_open(
    tmp_path: Path, redis_server_url: str
) -> None:
    huge = "x" * EIGHT_MB
    budget = {"budget": {"gpu_hours_per_month": 200}}
    with started(tmp_path, redis_server_url, executors=1, **lab(heartbeat_timeout_s=120), **budget) as svc:
        backend_token = register(svc)
        run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend=BACKEND)
        claimed, token = claim(svc, backend_token)
        assert claimed == run_id
        for batch in range(12):
            events = [
                {"v": 1, "event": "status", "t": 1, "state": "running", "step": f"epoch {batch}"},
                {"v": 1, "event": "metric", "t": 1, "split": "val", "name": f"huge{batch}", "value": huge},
                {"v": 1, "event": "metric", "t": 1, "split": "val", "name": "loss", "value": batch, "step": batch},
                {"v": 1, "event": "log", "t": 1, "level": "warning", "msg": f"batch {batch} sent"},
            ]
            if batch == 11:
                events.append({"v": 1, "event": "status", "t": 1, "state": "running", "step": huge})
                events.append({"v": 1, "event": "error", "t": 1, "code": "boom", "message": huge})
                events.append({"v": 1, "event": "usage", "gpus": ["0"], **dict.fromkeys(USAGE_FIGURES, 1e308)})
            assert agent_post(svc, f"/runs/{run_id}/events", token, {"events": events}) == (200, {"cancel": False})
        assert agent_post(svc, f"/runs/{run_id}/result", token, {"exit_code": 1})[0] == 200
        run = svc.wait_for(run_id, {"failed"}, 60)

        assert run_paths(svc, run_id).run_json.stat().st_size < SMALL_BYTES
        status, listing = svc.api("GET", "/runs")
        assert status == 200 and len(json.dumps(listing)) < SMALL_BYTES
        assert run["metrics"] == {"val/loss": 11}, "the huge metrics are left out; the batches' others all count"
        assert run["step"].startswith("xxx") and run["step"].endswith(
            f"({EIGHT_MB - MAX_LIVE_TEXT_CHARS} more characters)"
        )
        assert len(run["error"]) < 2 * MAX_LIVE_TEXT_CHARS
        status, events = svc.api("GET", f"/runs/{run_id}/events")
        assert [e["value"] for e in events if e["event"] == "metric"] == list(range(12))
        assert len(json.dumps(events)) < 4 * EIGHT_MB, "the page reads these: the huge metrics are not among them"
        log = run_paths(svc, run_id).run_log.read_text()
        assert log.count("[warning] batch ") == 12
        assert_gpu_use_bounded(svc, run, log)
        assert (
            "warning: 1 metric event(s) of a batch were not recorded: metric 'val/huge0': its value is text of "
            f"{EIGHT_MB} characters; fix: report a metric as a number, or as text of at most 200 characters"
        ) in log
