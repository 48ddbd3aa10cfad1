"""The ray backend's two figures, each against Ray's own in the same run, on a real Ray head.

    .venv/bin/python bench/bench_ray.py noop   [--runs 5]   a no-op run (majority-baseline) through potato-queue,
                                                             POST to succeeded, vs `ray job submit --no-wait` of a
                                                             job that does nothing, polled to SUCCEEDED by hand
                                                             (ratio; goal <= 1.1x), and vs the same job POSTed
                                                             to the Jobs API as curl would (no CLI start-up)
    .venv/bin/python bench/bench_ray.py cancel [--runs 5]   cancel of a running run, POST to `cancelled`, vs Ray's
                                                             own `ray job stop` of a sleeping job, to STOPPED
                                                             (ratio; goal <= 2x)
    .venv/bin/python bench/bench_ray.py all [--quick]

Everything is real: a Ray 2.60 head from .venv-ray (tests/ray_cluster.py), a private Redis, `potato-queue serve`
and `executor`. Ray's side is polled through the same Jobs API potato-queue uses, every POLL_S, as a person's
script would; potato-queue's through its admin API, every POLL_S. The by-hand submission runs Ray's own CLI
(`ray job submit --no-wait`), whose start-up is part of what a person pays.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.quick import quick_args  # noqa: E402
from potato_queue.processes.embedded_redis import EmbeddedRedis  # noqa: E402
from tests.lifecycle_helpers import TERMINAL, Services, started  # noqa: E402
from tests.ray_cluster import RAY, RayCluster  # noqa: E402

BACKEND = "ray-bench"
POLL_S = 0.05


@contextmanager
def stack(tmp: Path) -> Iterator[tuple[Services, RayCluster]]:
    with ExitStack() as exits:
        ray = RayCluster()
        exits.callback(ray.close)
        redis = exits.enter_context(EmbeddedRedis(tmp / "redis"))
        backend = {
            "type": "ray",
            "address": ray.address,
            "python": sys.executable,
            "workdir": str(tmp / "node"),
            "poll_interval_s": POLL_S,
        }
        svc = exits.enter_context(started(tmp / "project", redis.url, backend=BACKEND, backends={BACKEND: backend}))
        yield svc, ray


def _status(ray: RayCluster, job_id: str) -> str:
    job = ray.job(job_id)
    return "" if job is None else str(job["status"])


def by_hand_noop(ray: RayCluster) -> float:
    """`ray job submit --no-wait` of a job that does nothing, then its status polled to SUCCEEDED."""
    started_s = time.perf_counter()
    out = subprocess.run(
        [
            str(RAY),
            "job",
            "submit",
            "--address",
            ray.address,
            "--no-wait",
            "--entrypoint-num-gpus",
            "1",
            "--entrypoint-num-cpus",
            "1",
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    job_id = next(
        word.strip("'") for line in out.splitlines() for word in line.split() if word.startswith("'raysubmit_")
    )
    while _status(ray, job_id) != "SUCCEEDED":
        time.sleep(POLL_S)
    return time.perf_counter() - started_s


def by_hand_rest_noop(ray: RayCluster) -> float:
    """The same job POSTed to the Jobs API (as curl would: no CLI start-up), polled to SUCCEEDED."""
    started_s = time.perf_counter()
    job_id = ray.submit(f"{sys.executable} -c pass", num_gpus=1)
    while _status(ray, job_id) != "SUCCEEDED":
        time.sleep(POLL_S)
    return time.perf_counter() - started_s


def ours_noop(svc: Services) -> float:
    started_s = time.perf_counter()
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
    run = svc.wait_for(run_id, TERMINAL)
    assert run["state"] == "succeeded", run
    return time.perf_counter() - started_s


def noop(svc: Services, ray: RayCluster, runs: int) -> None:
    ours_noop(svc)  # untimed: the node fetches the agent once per version
    ours, hand, rest = [], [], []
    for _ in range(runs):
        ours.append(ours_noop(svc))
        hand.append(by_hand_noop(ray))
        rest.append(by_hand_rest_noop(ray))
    ours_s, hand_s, rest_s = statistics.median(ours), statistics.median(hand), statistics.median(rest)
    print(
        f"no-op run, median of {runs}: through potato-queue {ours_s:.2f} s (API -> succeeded: bundle, Ray job, agent, "
        f"worker, predictions back), `ray job submit --no-wait` of an empty job polled to SUCCEEDED by hand "
        f"{hand_s:.2f} s; ratio {ours_s / hand_s:.2f} (goal <= 1.1)",
        flush=True,
    )
    print(
        f"no-op run against the Jobs API by hand (POST /api/jobs/ as curl would, no CLI start-up), median of {runs}: "
        f"{rest_s:.2f} s; ratio {ours_s / rest_s:.2f} (goal <= 1.1)",
        flush=True,
    )


def ray_stop(ray: RayCluster) -> float:
    """Ray's own stop of a running job (a sleep), POST stop to STOPPED."""
    job_id = ray.submit(f"{sys.executable} -c 'import time; time.sleep(120)'", num_gpus=1)
    while _status(ray, job_id) != "RUNNING":
        time.sleep(POLL_S)
    time.sleep(0.5)  # its entrypoint under way
    started_s = time.perf_counter()
    with ray._open(f"/api/jobs/{job_id}/stop", b"{}"):
        pass
    while _status(ray, job_id) != "STOPPED":
        time.sleep(POLL_S)
    return time.perf_counter() - started_s


def our_cancel(svc: Services) -> float:
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], params={"hold_s": 120})
    svc.wait_for(run_id, {"running"})
    time.sleep(1.0)  # its worker under way, as Ray's sleeping job is
    started_s = time.perf_counter()
    assert svc.api("POST", f"/runs/{run_id}/cancel")[0] == 200
    while svc.api("GET", f"/runs/{run_id}")[1]["state"] not in TERMINAL:
        time.sleep(POLL_S)
    return time.perf_counter() - started_s


def cancel(svc: Services, ray: RayCluster, runs: int) -> None:
    ours, theirs = [], []
    for _ in range(runs):
        ours.append(our_cancel(svc))
        theirs.append(ray_stop(ray))
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    print(
        f"cancel of a running run, median of {runs}: potato-queue POST cancel -> cancelled {ours_s:.2f} s, Ray's "
        f"own stop of a running job -> STOPPED {theirs_s:.2f} s; ratio {ours_s / theirs_s:.2f} (goal <= 2)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("which", choices=["noop", "cancel", "all"])
    parser.add_argument("--runs", type=int, default=5)
    args = quick_args(parser, runs=1)
    with tempfile.TemporaryDirectory(prefix="pq-bench-ray-") as folder, stack(Path(folder)) as (svc, ray):
        if args.which in ("noop", "all"):
            noop(svc, ray, args.runs)
        if args.which in ("cancel", "all"):
            cancel(svc, ray, args.runs)


if __name__ == "__main__":
    main()
