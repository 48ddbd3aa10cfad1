"""The slurm backend's three figures, each against the real reference in the same run.

    .venv/bin/python bench/bench_slurm.py start  [--runs 5]   SLURM's PENDING -> RUNNING to `RUNNING on <node>` in
                                                               run.log (goal: within poll_interval_s + 1 s)
    .venv/bin/python bench/bench_slurm.py cancel [--runs 10]  cancel -> scancel issued, p95 (goal <= 1 s)
    .venv/bin/python bench/bench_slurm.py noop   [--runs 5]   a no-op run through sbatch vs `sbatch --wait` of the
                                                               same job.sh by hand on the login node (ratio)
    .venv/bin/python bench/bench_slurm.py all
    .venv/bin/python bench/bench_slurm.py all --quick         seconds: a 1 s poll, majority-baseline's hold to cancel

Everything is real: a real single-node SLURM (tests/slurm_cluster.py) behind a
real sshd on 127.0.0.1 (tests/sshd.py, the login node), a private Redis,
`potato-queue serve` and `worker`. Run as root. When a job starts is read from
SLURM (scontrol's StartTime, to the second) and from the moment the job's first
line ran (job.sh's `running` file, to the nanosecond); when scancel was issued
from a scancel in front of the real one on the backend's PATH that notes the time.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_lifecycle import p95  # noqa: E402

from bench.long_runs import HF, HOLD, trainer_arg, until_stopped  # noqa: E402
from bench.quick import quick_args  # noqa: E402
from potato_queue.agent.run_files import extract_bundle  # noqa: E402
from potato_queue.processes.embedded_redis import EmbeddedRedis  # noqa: E402
from potato_queue.settings import SSH_CONFIG_ENV  # noqa: E402
from tests.lifecycle_helpers import TERMINAL, Services, run_paths, started  # noqa: E402
from tests.slurm_cluster import CPUS, SlurmCluster  # noqa: E402
from tests.sshd import ALIAS, Sshd  # noqa: E402

BACKEND = "cluster"


@dataclass
class Stack:
    svc: Services
    slurm: SlurmCluster
    shared: Path  # the cluster's shared storage: remote_dir
    scancel_times: Path  # a line per scancel issued, its time
    poll_s: float  # the backend's poll_interval_s
    warm_runs: int  # untimed no-op runs before noop's


@contextmanager
def cluster(tmp: Path, poll_s: float, warm_runs: int) -> Iterator[Stack]:
    """One cluster, login node and stack for the three benchmarks: job folders kept (start and noop read them),
    the model files left on the cluster (noop times the run, not a copy back), and a scancel in front of the
    real one on the backend's PATH that notes when it was issued (cancel)."""
    shim = tmp / "shim"
    shim.mkdir(parents=True)
    noted = tmp / "scancel-times"
    (shim / "scancel").write_text(f'#!/bin/sh\ndate +%s.%N >> {noted}\nexec /usr/bin/scancel "$@"\n')
    (shim / "scancel").chmod(0o755)
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        slurm = SlurmCluster(tmp / "slurm")
        stack.callback(slurm.close)
        sshd = Sshd(tmp / "sshd")
        stack.callback(sshd.close)
        shared = Path(tempfile.mkdtemp(prefix="pq-bench-", dir="/srv"))
        stack.callback(subprocess.run, ["rm", "-rf", str(shared)], check=False)
        url = stack.enter_context(EmbeddedRedis(folder)).url
        settings = {
            "type": "slurm",
            "host": ALIAS,
            "python": sys.executable,
            "job_python": sys.executable,
            "remote_dir": str(shared),
            "poll_interval_s": poll_s,
            "heartbeat_timeout_s": 60,
            "keep_remote": True,
            "fetch_artifacts": False,
            "env": {**slurm.env, "PATH": f"{shim}:/usr/local/bin:/usr/bin:/bin"},
        }
        svc = stack.enter_context(
            started(tmp / "project", url, executors=0, grace_seconds=5, backends={BACKEND: settings})
        )
        svc.executor(env={SSH_CONFIG_ENV: str(sshd.config)})
        yield Stack(svc, slurm, shared, noted, poll_s, warm_runs)


def wait(predicate: Any, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.02)
    raise TimeoutError("gave up waiting")


def events(svc: Services, run_id: str) -> list[dict[str, Any]]:
    path = run_paths(svc, run_id).events
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def step_event(svc: Services, run_id: str, pattern: str) -> dict[str, Any] | None:
    return next((e for e in events(svc, run_id) if re.search(pattern, str(e.get("step")))), None)


# ---------------------------------------------------------------- start: PENDING -> RUNNING


def start(stack: Stack, tmp: Path, runs: int, _trainer: str) -> None:
    file_lag, slurm_lag = [], []
    svc, slurm, shared = stack.svc, stack.slurm, stack.shared
    for _ in range(runs):
        blocker = slurm.run("sbatch", "--parsable", f"--cpus-per-task={CPUS}", "--wrap", "sleep 300").stdout.strip()
        wait(lambda blocker=blocker: f"{blocker} RUNNING" in slurm.queue())
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        pending = wait(lambda run_id=run_id: step_event(svc, run_id, r"PENDING \(Resources\)"))
        job = re.search(r"SLURM job (\d+)", pending["step"]).group(1)  # type: ignore[union-attr]
        time.sleep(stack.poll_s * 0.37)  # the release lands anywhere in a poll interval
        slurm.run("scancel", blocker)
        running = wait(lambda run_id=run_id: step_event(svc, run_id, r"RUNNING on "))
        svc.wait_for(run_id, TERMINAL)
        fields = dict(re.findall(r"(\w+)=(\S+)", slurm.run("scontrol", "show", "job", "-o", job).stdout))
        slurm_start = datetime.fromisoformat(fields["StartTime"]).timestamp()
        first_line_s = (shared / "jobs" / run_id / "running").stat().st_mtime
        file_lag.append(running["t"] - first_line_s)
        slurm_lag.append(running["t"] - slurm_start)
    print(
        f"SLURM start: PENDING -> RUNNING to `RUNNING on <node>` in run.log, poll_interval_s {stack.poll_s:g}, {runs} runs: "
        f"median {statistics.median(file_lag):.3f} s, max {max(file_lag):.3f} s after the job's first line ran; "
        f"max {max(slurm_lag):.2f} s after SLURM's StartTime (whole seconds) (goal <= {stack.poll_s + 1:g} s)",
        flush=True,
    )


# ---------------------------------------------------------------- cancel -> scancel issued


def trains(svc: Services, run_id: str) -> bool:
    """The run's trainer has begun: the fine-tune's `training ...` step (before its first update), or a hold's
    first train progress."""
    return any(
        re.search(r"^training ", str(e.get("step"))) or (e.get("event") == "progress" and e.get("phase") == "train")
        for e in events(svc, run_id)
    )


def cancel(stack: Stack, tmp: Path, runs: int, trainer: str) -> None:
    params = until_stopped(tmp, trainer)
    took = []
    svc, noted = stack.svc, stack.scancel_times
    for _ in range(runs):
        run_id = svc.start_run(trainer=trainer, schemas=["sentiment"], params=params, backend=BACKEND)
        wait(lambda run_id=run_id: trains(svc, run_id))
        noted.write_text("")
        sent = time.time()
        svc.api("POST", f"/runs/{run_id}/cancel")
        first = wait(lambda: noted.read_text().split())[0]
        took.append(float(first) - sent)
        svc.wait_for(run_id, TERMINAL, 60)
    print(
        f"SLURM cancel: the API's cancel -> `scancel --full --signal=TERM` issued on the login node, {runs} runs: "
        f"p95 {p95(took):.3f} s, median {statistics.median(took):.3f} s (goal p95 <= 1 s)",
        flush=True,
    )


# ---------------------------------------------------------------- a no-op run vs sbatch --wait by hand


def noop(stack: Stack, tmp: Path, runs: int, _trainer: str) -> None:
    ours, hand = [], []
    svc, slurm = stack.svc, stack.slurm
    for _warm in range(stack.warm_runs):
        svc.wait_for(svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND), TERMINAL)
    for i in range(runs):
        started_s = time.perf_counter()
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        run = svc.wait_for(run_id, TERMINAL)
        ours.append(time.perf_counter() - started_s)
        assert run["state"] == "succeeded", run
        job_dir = Path(run["artifact_uri"].split(":", 1)[1]).parent
        for name in ("exit_code", "running", "events.jsonl", "stderr.log", "slurm.out"):
            (job_dir / name).unlink(missing_ok=True)
        # The agent removed the unpacked bundle after its run; the hand run gets it back, untimed.
        extract_bundle(str(run_paths(svc, run_id).bundle), str(job_dir / "bundle"))
        started_s = time.perf_counter()
        slurm.run(
            "sbatch",
            "--wait",
            "--parsable",
            f"--output={job_dir}/slurm.out",
            f"--chdir={job_dir}/work",
            str(job_dir / "job.sh"),
        )
        hand.append(time.perf_counter() - started_s)
        assert (job_dir / "exit_code").read_text().strip() == "0", f"hand run {i} failed"
    ours_s, hand_s = statistics.median(ours), statistics.median(hand)
    print(
        f"SLURM no-op run (majority-baseline), median of {runs}: through potato-queue {ours_s:.2f} s (API -> "
        f"succeeded: ssh, agent, bundle, sbatch, predictions back), `sbatch --wait job.sh` by hand on the login "
        f"node {hand_s:.2f} s; ratio {ours_s / hand_s:.2f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("which", choices=["start", "cancel", "noop", "all"])
    parser.add_argument("--runs", type=int)
    parser.add_argument("--poll-s", type=float, default=5.0, help="the backend's poll_interval_s")
    trainer_arg(parser, "the cancelled runs")
    parser.add_argument("--warm-runs", type=int, default=1, help="noop's untimed runs first")
    # --quick: no warm-up run (start's and cancel's runs have put the code on the cluster by then)
    args = quick_args(parser, poll_s=1.0, trainer=HOLD, warm_runs=0)
    with (
        tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp,
        cluster(Path(tmp), args.poll_s, args.warm_runs) as stack,
    ):
        for name, bench, default in (("start", start, 5), ("cancel", cancel, 10), ("noop", noop, 5)):
            if args.which in (name, "all"):
                bench(stack, Path(tmp) / name, args.runs or (1 if args.quick else default), args.trainer or HF)


if __name__ == "__main__":
    main()
