"""P1, P2, P3, P9, P10: a run's life through the queue, against the same worker started by hand.

Everything is real: Redis, `potato-queue serve`, `potato-queue executor`
(executors), the agent and the worker. The alternative in each comparison
is what an admin would do without potato-queue: start
`python -m potato_queue.worker --spec spec.json` by hand on the same bundle,
and signal it by hand.

    .venv/bin/python bench/bench_lifecycle.py p1 [--runs 20]   cancel -> SIGTERM at the worker, p95
    .venv/bin/python bench/bench_lifecycle.py p2 [--runs 10]   POST -> the worker's first event
    .venv/bin/python bench/bench_lifecycle.py p3 [--runs 200]  queued no-op runs: FIFO, overhead per run
    .venv/bin/python bench/bench_lifecycle.py p9 [--epochs 30] hf-text-classification wall, queue vs direct
    .venv/bin/python bench/bench_lifecycle.py p10              heartbeat-loss and wall-limit detection error
    .venv/bin/python bench/bench_lifecycle.py all
    .venv/bin/python bench/bench_lifecycle.py all --quick   seconds: one stack, P10 beside, majority-baseline

--trainer: P1's cancelled runs', P9's and P10's stopped ones' (bench/long_runs.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.long_runs import HF, HOLD, fit, trainer_arg, until_stopped  # noqa: E402
from bench.quick import both, quick_args  # noqa: E402
from potato_queue.processes.embedded_redis import EmbeddedRedis  # noqa: E402
from tests.lifecycle_helpers import Services, run_paths, started  # noqa: E402

TERMINAL = {"succeeded", "failed", "cancelled"}
HEARTBEAT_TIMEOUT_S = 3  # P10's heartbeat_timeout_s


# ---------------------------------------------------------------- set-up


@contextmanager
def services(tmp: Path, executors: int = 1, **training: Any) -> Iterator[Services]:
    """The test suite's services (tests/lifecycle_helpers.py), on a private Redis (never the user's own,
    which hundreds of benchmark runs would fill)."""
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        url = stack.enter_context(EmbeddedRedis(folder)).url
        yield stack.enter_context(started(tmp, url, executors, grace_seconds=5, **training))


@dataclass
class Setup:
    """What every figure runs with: the long runs' trainer, P10's first wall limit, whether P10's two stacks run at
    once (--overlap) and, with --one-stack, one stack for all (with P10's heartbeat timeout) instead of one each."""

    trainer: str
    wall_limit_s: float
    overlap: bool
    shared: Services | None = None

    @contextmanager
    def stack(self, tmp: Path, **training: Any) -> Iterator[Services]:
        if self.shared is None:
            with services(tmp, **training) as svc:
                yield svc
        else:
            assert training.items() <= {"heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S}.items(), training
            yield self.shared


def run_dir(svc: Services, run_id: str) -> Path:
    return run_paths(svc, run_id).dir


def events(svc: Services, run_id: str) -> list[dict[str, Any]]:
    path = run_dir(svc, run_id) / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def wait(predicate: Callable[[], Any], timeout_s: float = 120, poll_s: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError("condition not met")


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def hand_worker(
    tmp: Path, bundle: Path, trainer: str, params: dict[str, Any], name: str
) -> tuple[subprocess.Popen[str], Path]:
    """The alternative: the worker started by hand on a copy of the run's bundle."""
    work = tmp / f"hand-{name}"
    spec = {
        "v": 1,
        "run_id": "20260101T000000-000000",
        "trainer": trainer,
        "schemas": ["sentiment"],
        "bundle_dir": str(bundle),
        "workdir": str(work / "work"),
        "params": params,
        "seed": 0,
        "limits": {"device": "cpu"},
    }
    work.mkdir(parents=True)
    (work / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.Popen(
        [sys.executable, "-m", "potato_queue.worker", "--spec", str(work / "spec.json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=str(ROOT),
        start_new_session=True,
    )
    return proc, work


def first_bundle(svc: Services) -> Path:
    """A run's bundle, copied aside: retain_runs prunes the run's own copy once newer runs end."""
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
    svc.wait_for(run_id, TERMINAL)
    aside = svc.tmp_path / f"bundle-{run_id}"
    shutil.copytree(run_dir(svc, run_id) / "bundle", aside)
    return aside


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def report(name: str, ours: float, theirs: float, unit: str, what: str, goal: str) -> None:
    ratio = ours / theirs if theirs else float("inf")
    print(
        f"{name}: {what}: potato-queue {ours:.3f} {unit}, by hand {theirs:.3f} {unit}, ratio {ratio:.2f} (goal {goal})",
        flush=True,
    )


def read_until(proc: subprocess.Popen[str], match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if match(event):
            return event
    raise RuntimeError("the worker ended before the event")


def is_training(e: dict[str, Any]) -> bool:
    return e.get("event") == "progress" and e.get("phase") == "train"


def is_cancelled(e: dict[str, Any]) -> bool:
    return e.get("event") == "status" and e.get("state") == "cancelled"


def is_first_worker_event(e: dict[str, Any]) -> bool:
    return e.get("event") == "status" and e.get("step") == "reading the spec"


def find(svc: Services, run_id: str, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    return next((e for e in events(svc, run_id) if match(e)), None)


# ---------------------------------------------------------------- the benchmarks

# An event's "t" is rounded to the millisecond (wire/events.py): a lag below that can read as negative.
EVENT_TIME_RESOLUTION_S = 0.001


def lag_s(event: dict[str, Any], sent: float) -> float:
    """From `sent` to the worker's event, no finer than the event's own clock."""
    return max(event["t"] - sent, EVENT_TIME_RESOLUTION_S)


def hand_cancel_s(tmp: Path, bundle: Path, params: dict[str, Any], runs: int, trainer: str = HF) -> list[float]:
    """The alternative for P1: SIGTERM by hand to the worker started by hand, until it says cancelled."""
    took: list[float] = []
    for i in range(runs):
        proc, _ = hand_worker(tmp, bundle, trainer, params, f"p1-{i}")
        read_until(proc, is_training)
        sent = time.time()
        os.killpg(proc.pid, signal.SIGTERM)
        took.append(lag_s(read_until(proc, is_cancelled), sent))
        proc.wait()
    return took


def cancel_s(
    svc: Services, params: dict[str, Any], runs: int, trainer: str = HF, **where: Any
) -> tuple[list[float], str]:
    """P1 through the queue: start a long run (on `where`'s backend), cancel it once it trains, and time
    cancel -> the worker says cancelled; the times and the last run's id."""
    took: list[float] = []
    run_id = ""
    for _ in range(runs):
        run_id = svc.start_run(trainer=trainer, schemas=["sentiment"], params=params, **where)
        wait(lambda run_id=run_id: find(svc, run_id, is_training), 120)
        sent = time.time()
        svc.api("POST", f"/runs/{run_id}/cancel")
        took.append(lag_s(wait(lambda run_id=run_id: find(svc, run_id, is_cancelled), 60), sent))
        svc.wait_for(run_id, TERMINAL)
    return took, run_id


def p1(tmp: Path, runs: int, setup: Setup) -> None:
    params = until_stopped(tmp, setup.trainer)
    with setup.stack(tmp / "p1") as svc:
        ours, run_id = cancel_s(svc, params, runs, setup.trainer)
        hand = hand_cancel_s(tmp, run_dir(svc, run_id) / "bundle", params, runs, setup.trainer)
    report("P1", p95(ours), p95(hand), "s", f"cancel -> worker stops, p95 of {runs}", "<= 1 s")


def p2(tmp: Path, runs: int, setup: Setup) -> None:
    ours: list[float] = []
    with setup.stack(tmp / "p2") as svc:
        bundle = first_bundle(svc)  # also warms the executor up
        for _ in range(runs):
            posted = time.time()
            run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
            ours.append(wait(lambda run_id=run_id: find(svc, run_id, is_first_worker_event), 60)["t"] - posted)
            svc.wait_for(run_id, TERMINAL)
    hand: list[float] = []
    for i in range(runs):
        started = time.time()
        proc, _ = hand_worker(tmp, bundle, "majority-baseline", {}, f"p2-{i}")
        hand.append(read_until(proc, is_first_worker_event)["t"] - started)
        proc.wait()
    report(
        "P2",
        statistics.median(ours),
        statistics.median(hand),
        "s",
        f"POST (or Popen) -> the worker's first event, median of {runs}",
        "ratio <= 1.3",
    )


def p3(tmp: Path, runs: int, setup: Setup) -> None:
    with setup.stack(tmp / "p3") as svc:
        bundle = first_bundle(svc)
        started = time.time()
        ids = [svc.start_run(trainer="majority-baseline", schemas=["sentiment"]) for _ in range(runs)]
        done = [svc.wait_for(i, TERMINAL, timeout_s=1800) for i in ids]
        wall = max(epoch(r["finished_at"]) for r in done) - started
    fifo = [r["started_at"] for r in done] == sorted(r["started_at"] for r in done)
    serial = all(a["finished_at"] <= b["started_at"] for a, b in zip(done, done[1:], strict=False))
    ok = sum(r["state"] == "succeeded" for r in done)
    hand: list[float] = []
    for i in range(min(runs, 10)):
        t0 = time.monotonic()
        proc, _ = hand_worker(tmp, bundle, "majority-baseline", {}, f"p3-{i}")
        proc.communicate()
        hand.append(time.monotonic() - t0)
    per_run, worker = wall / runs, statistics.mean(hand)
    print(f"P3: {runs} queued runs: {ok} succeeded, FIFO kept: {fifo}, one at a time: {serial}", flush=True)
    report("P3", per_run, worker, "s", "wall per run (queue) vs the worker alone", "overhead <= 0.050 s")
    print(f"P3: queue overhead per run beyond the worker's own time: {1000 * (per_run - worker):.0f} ms", flush=True)


def p9(tmp: Path, epochs: int, setup: Setup) -> None:
    params = fit(tmp, setup.trainer, epochs)
    with setup.stack(tmp / "p9") as svc:
        bundle = first_bundle(svc)
        posted = time.time()
        run_id = svc.start_run(trainer=setup.trainer, schemas=["sentiment"], params=params)
        run = svc.wait_for(run_id, TERMINAL, timeout_s=3600)
        queue_s = epoch(run["finished_at"]) - posted
        assert run["state"] == "succeeded", run
    t0 = time.monotonic()
    proc, _ = hand_worker(tmp, bundle, setup.trainer, params, "p9")
    proc.communicate()
    report("P9", queue_s, time.monotonic() - t0, "s", f"{setup.trainer}, {epochs} epochs, CPU", "ratio <= 1.05")


def agent_pid(svc: Services, run_id: str) -> int:
    """From run.log: a pre-started agent's command line does not name its run."""
    log = (run_dir(svc, run_id) / "run.log").read_text()
    return int(re.search(r"started the agent on this machine \(pid (\d+)", log).group(1))  # type: ignore[union-attr]


def heartbeat_error(tmp: Path, params: dict[str, Any], setup: Setup) -> float:
    """From the agent's last heartbeat (it is stopped, SIGSTOP, while its run trains) to the run's failure, less
    heartbeat_timeout_s."""
    with setup.stack(tmp / "p10h", heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S) as svc:
        run_id = svc.start_run(trainer=setup.trainer, schemas=["sentiment"], params=params)
        wait(lambda run_id=run_id: find(svc, run_id, is_training), 120)
        os.kill(agent_pid(svc, run_id), signal.SIGSTOP)
        time.sleep(0.3)  # let a batch already on the wire land
        last_beat = svc.api("GET", f"/runs/{run_id}")[1]["heartbeat_at"]
        run = svc.wait_for(run_id, TERMINAL, timeout_s=60)
    return epoch(run["finished_at"]) - (last_beat + HEARTBEAT_TIMEOUT_S)


def wall_limit_error(tmp: Path, params: dict[str, Any], setup: Setup) -> tuple[float, float, Path]:
    """From a run's wall limit to its worker's word that it stopped; the limit used; the run's bundle.

    The limit must fall once the agent is up: one that falls before the agent's first contact is a hard stop
    (supervise.py), with no worker to say so. On a loaded machine (the suite runs this beside its other tests) the
    start can take longer than the first limit (4 s); then the limit is doubled and the run tried again."""
    limit_s = setup.wall_limit_s
    for attempt in range(4):
        with services(tmp / f"p10w-{attempt}", max_wall_seconds=limit_s) as svc:
            run_id = svc.start_run(trainer=setup.trainer, schemas=["sentiment"], params=params)
            svc.wait_for(run_id, TERMINAL, timeout_s=limit_s + 60)
            stopped = find(svc, run_id, is_cancelled)
            if stopped is not None:
                started_s = epoch(svc.api("GET", f"/runs/{run_id}")[1]["started_at"])
                return stopped["t"] - (started_s + limit_s), limit_s, run_dir(svc, run_id) / "bundle"
        print(f"P10: the {limit_s:g} s wall limit fell before the agent was up (a loaded machine); doubled", flush=True)
        limit_s *= 2
    raise TimeoutError(f"P10: no run's agent was up before its wall limit, up to {limit_s / 2:g} s")


def p10(tmp: Path, _: int, setup: Setup) -> None:
    params = until_stopped(tmp, setup.trainer)
    beat_error, (wall_error, limit_s, bundle) = both(
        lambda: heartbeat_error(tmp, params, setup), lambda: wall_limit_error(tmp, params, setup), setup.overlap
    )
    # By hand: GNU timeout(1) around the worker, the usual way to bound a run.
    spec_proc, work = hand_worker(tmp, bundle, setup.trainer, params, "p10")
    spec_proc.kill()
    spec_proc.wait()
    t0 = time.time()
    proc = subprocess.Popen(
        ["timeout", "-s", "TERM", f"{limit_s:g}", sys.executable, "-m", "potato_queue.worker"]
        + ["--spec", str(work / "spec.json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=str(ROOT),
    )
    hand_error = read_until(proc, is_cancelled)["t"] - (t0 + limit_s)
    proc.wait()
    print(f"P10: heartbeat loss detected {beat_error:.2f} s after heartbeat_timeout_s (goal <= 2 s)", flush=True)
    report("P10", wall_error, hand_error, "s", "wall limit: SIGTERM at the worker after the limit", "<= 1 s")


# name: (bench, its size: runs or epochs, the size of --quick)
BENCHES: dict[str, tuple[Callable[[Path, int, Setup], None], int, int]] = {
    "p1": (p1, 20, 1),
    "p2": (p2, 10, 1),
    "p3": (p3, 200, 5),
    "p9": (p9, 30, 1),
    "p10": (p10, 0, 0),  # last: with --one-stack, it leaves the shared stack's agent stopped
}


def run_figure(name: str, args: argparse.Namespace, setup: Setup) -> None:
    bench, default, quick = BENCHES[name]
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        bench(Path(tmp), args.epochs or args.runs or (quick if args.quick else default), setup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=[*BENCHES, "all"])
    parser.add_argument("--runs", type=int, default=None, help="runs (p1, p2, p3) or epochs (p9)")
    parser.add_argument("--epochs", type=int, default=None)
    trainer_arg(parser, "the long runs")
    parser.add_argument("--wall-limit-s", type=float, default=4.0, help="P10's max_wall_seconds, doubled if too short")
    parser.add_argument("--one-stack", action="store_true", help="one server and executor for every figure but P10's")
    parser.add_argument("--overlap", action="store_true", help="P10's stacks beside the other figures and each other")
    args = quick_args(parser, trainer=HOLD, wall_limit_s=2.0, one_stack=True, overlap=True)
    names = list(BENCHES) if args.which == "all" else [args.which]
    setup = Setup(args.trainer or HF, args.wall_limit_s, args.overlap)
    with ExitStack() as stack, ThreadPoolExecutor(1) as aside:
        beside = None
        if args.overlap and len(names) > 1 and "p10" in names:
            # P10 is mostly waiting (a heartbeat timeout, a wall limit, timeout(1)): beside the others, not after.
            names.remove("p10")
            beside = aside.submit(run_figure, "p10", args, Setup(setup.trainer, setup.wall_limit_s, args.overlap))
        if args.one_stack:
            shared = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-shared-")))
            setup.shared = stack.enter_context(services(shared, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S))
        for name in names:
            run_figure(name, args, setup)
        if beside is not None:
            beside.result()  # its failure fails the run


if __name__ == "__main__":
    main()
