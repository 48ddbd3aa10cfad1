"""A year of runs: what the list API, the CLI, the page's runs, /metrics and a new run's submission cost at 20,000
runs, against the same at 10 (issue 52; goal: each within 2x, memory within 1.2x).

Each size runs in a child process of its own (peak RSS is per process) on a private Redis: the run records are
written straight to disk as finished runs' run.json (a fast path: making 20,000 runs through the queue takes
hours), and the server reads them as it reads any (the real app, in process, through TestClient). Measured per
size, the median of a few tries each:
- `list first`: GET /runs?limit=10 (the newest page); `list last`: the oldest page, by its cursor (pages of 10
  at both sizes: a 10-run project has one page of 10, so a bigger page would time a fuller page, not history);
- `page runs`: GET /runs?limit=10 through the path the Training page's stream reads twice a second;
- `cli runs`: `potato-queue training runs` (a process start included, at both sizes);
- `metrics rebuild`: the first scrape ever (an upgrade's: it reads every record once and writes the finished
  runs' index, metrics_tally.json); `metrics restart`: a new server's first scrape (the index and the runs it
  does not hold); `metrics`: a later scrape;
- `submit`: POST /runs to 202 (the run's record, budget and checks);
- `run to succeeded`: a majority-baseline run's POST to its success, through a real executor (Celery, the
  local agent and worker), after one warm run;
- `peak rss`: the child's peak memory after all of it.

    .venv/bin/python bench/bench_history.py [--runs 20000] [--small 10]
    .venv/bin/python bench/bench_history.py --quick     300 runs against 10, the two children side by side
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.quick import both, quick_args  # noqa: E402

__all__ = ["main"]

ADMIN_KEY = "bench-history-key-0123"
TRIES = 5
PAGE = 10
FIGURES = (
    "list first",
    "list last",
    "page runs",
    "cli runs",
    "metrics rebuild",
    "metrics restart",
    "metrics",
    "submit",
    "run to succeeded",
    "peak rss",
)


def _project(folder: Path) -> Path:
    import yaml

    shutil.copytree(ROOT / "tests" / "fixtures" / "reviews_small", folder / "project")
    config = folder / "project" / "config.yaml"
    data = yaml.safe_load(config.read_text())
    data["admin_api_key"] = ADMIN_KEY
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    return config


def _records(store: Any, n: int) -> None:
    """`n` succeeded runs, a second apart, as run.json files (the store's own record shape and writer)."""
    from potato_queue.run import RunState
    from potato_queue.store.keys import new_run_id
    from potato_queue.store.records import utc_of, write_json_atomic

    # 25 minutes apart up to yesterday: 20,000 runs are a year's retraining, none past retain_run_records_days.
    start = datetime.now(timezone.utc) - timedelta(days=1, seconds=n * 1500)
    # A run's record as the store writes it; that run itself is then removed whole (folder and Redis).
    template = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")
    shutil.rmtree(store.paths(template["run_id"]).dir)
    store.forget(template["run_id"])
    for k in range(n):
        at = start + timedelta(seconds=k * 1500)
        run_id = new_run_id(at)
        folder = store.paths(run_id).dir
        folder.mkdir(parents=True)
        record = {
            **template,
            "run_id": run_id,
            "state": RunState.SUCCEEDED,
            "created_at": utc_of(at.timestamp()),
            "started_at": utc_of(at.timestamp() + 1),
            "finished_at": utc_of(at.timestamp() + 9),
            "held_out": {"sentiment": {"test": {"accuracy": 0.55, "macro_f1": 0.5, "n": 20}}},
        }
        write_json_atomic(folder / "run.json", record)


def _timed(step: Callable[[], Any], tries: int = TRIES) -> float:
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def child(n: int, redis_url: str) -> dict[str, float]:
    """The figures at `n` runs, in this process."""
    from contextlib import closing

    import redis
    from fastapi.testclient import TestClient

    from potato_queue.server.app import create_app
    from potato_queue.store import RunStore
    from potato_queue.validate import load_checked

    folder = Path(tempfile.mkdtemp(prefix="bench-history-"))
    config_path = _project(folder)
    config = load_checked(config_path)
    _records(RunStore(config, redis.Redis.from_url(redis_url)), n)
    head = {"X-API-Key": ADMIN_KEY}
    out: dict[str, float] = {}
    app = create_app(config, redis_url, enqueue=lambda run_id: None)
    runs = app.state.runs  # the RunService the page's stream lists with
    with closing(TestClient(app)) as client:
        api = "/admin/training/api"
        client.get(f"{api}/backends", headers=head)  # the app's first request (its imports, the device probe)
        out["list first"] = _timed(lambda: client.get(f"{api}/runs?limit={PAGE}", headers=head).raise_for_status())
        # The cursor of the oldest page: the run PAGE from the oldest (one page at the 10-run project).
        oldest = client.get(f"{api}/runs?limit={max(1, n - PAGE)}", headers=head).headers.get("X-Next-Before")
        last = f"{api}/runs?limit={PAGE}" + (f"&before={oldest}" if oldest else "")
        out["list last"] = _timed(lambda: client.get(last, headers=head).raise_for_status())
        out["page runs"] = _timed(lambda: runs.listed(PAGE))
        out["metrics rebuild"] = _timed(lambda: client.get("/metrics", headers=head).raise_for_status(), tries=1)
        out["metrics"] = _timed(lambda: client.get("/metrics", headers=head).raise_for_status())
        # In a process of its own, as a restart is: its apps' memory is not this server's.
        restart = [sys.executable, __file__, "--restart", str(config_path), "--redis-url", redis_url]
        out["metrics restart"] = float(subprocess.run(restart, capture_output=True, text=True, check=True).stdout)
        body = {"trainer": "majority-baseline", "schemas": ["sentiment"]}
        out["submit"] = _timed(lambda: client.post(f"{api}/runs", json=body, headers=head).raise_for_status())
    for run_id, _ in runs.store.index.unfinished():  # the submissions above: not the executor's to run first
        runs.cancel(run_id)
    out["run to succeeded"] = _run_to_end(config_path, redis_url, runs)
    env = {**os.environ, "POTATO_QUEUE_REDIS_URL": redis_url}
    cli = [sys.executable, "-m", "potato_queue.cli", "training", "runs", str(config_path)]
    out["cli runs"] = _timed(lambda: _cli(cli, env), tries=3)
    out["peak rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MB
    return out


def _first_scrape_of_a_new_server(config_path: Path, redis_url: str) -> float:
    """A new server's first /metrics (its app made afresh, as at a restart): the median of a few."""
    from contextlib import closing

    from fastapi.testclient import TestClient

    from potato_queue.server.app import create_app
    from potato_queue.validate import load_checked

    config, head = load_checked(config_path), {"X-API-Key": ADMIN_KEY}
    times = []
    for _ in range(3):
        with closing(TestClient(create_app(config, redis_url, enqueue=lambda run_id: None))) as client:
            times.append(_timed(lambda: client.get("/metrics", headers=head).raise_for_status(), tries=1))
    return statistics.median(times)


def _run_to_end(config_path: Path, redis_url: str, runs: Any) -> float:
    """A majority-baseline run's POST to its success, through a real server and executor (`potato-queue serve`,
    `potato-queue executor`: the local agent reports to the server), after one warm run."""
    import socket
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "POTATO_QUEUE_REDIS_URL": redis_url}
    cli = [sys.executable, "-m", "potato_queue.cli"]
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for argv in ([*cli, "serve", str(config_path), "--port", str(port)], [*cli, "executor", str(config_path)])
    ]
    url = f"http://127.0.0.1:{port}"

    def post_run() -> str:
        body = json.dumps({"trainer": "majority-baseline", "schemas": ["sentiment"]}).encode()
        headers = {"X-API-Key": ADMIN_KEY, "Content-Type": "application/json"}
        request = urllib.request.Request(f"{url}/admin/training/api/runs", data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=60) as reply:
            return str(json.loads(reply.read())["run_id"])

    try:
        _wait_healthy(url)
        _wait_state(runs, post_run(), {"succeeded", "failed", "cancelled"})  # warm
        start = time.perf_counter()
        run_id = post_run()
        if _wait_state(runs, run_id, {"succeeded", "failed", "cancelled"}) != "succeeded":
            raise SystemExit(f"run {run_id} did not succeed: {runs.get(run_id)}")
        return time.perf_counter() - start
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(60)


def _wait_healthy(url: str, timeout_s: float = 60) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5) as reply:
                if reply.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server at {url} and its executor were not up within {timeout_s} s")


def _wait_state(runs: Any, run_id: str, states: set[str], timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = str(runs.get(run_id)["state"])
        if state in states:
            return state
        time.sleep(0.05)
    raise SystemExit(f"run {run_id} did not end within {timeout_s} s")


def _cli(argv: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"training runs failed: {done.stderr[-2000:]}")


def _run_child(n: int, redis_url: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(n), "--redis-url", redis_url], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"the {n}-run child failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _size(n: int) -> dict[str, float]:
    """The figures at `n` runs, from a child on a Redis of its own."""
    from potato_queue.processes.embedded_redis import EmbeddedRedis

    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="bench-history-redis-")))
    try:
        return _run_child(n, server.start())
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--restart", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--side-by-side", action="store_true", help="both sizes' children at once")
    args = quick_args(parser, argv, runs=300, side_by_side=True)
    if args.restart is not None:
        print(_first_scrape_of_a_new_server(args.restart, args.redis_url))
        return 0
    if args.child is not None:
        print(json.dumps(child(args.child, args.redis_url)))
        return 0
    small, large = both(lambda: _size(args.small), lambda: _size(args.runs), args.side_by_side)
    print(f"{'':16} {args.small:>10} runs {args.runs:>10} runs   ratio")
    for name in FIGURES:
        unit = "MB" if name == "peak rss" else "ms"
        scale = 1 if unit == "MB" else 1000
        a, b = small[name] * scale, large[name] * scale
        print(f"{name:16} {a:10.1f} {unit:4} {b:10.1f} {unit:4}  ratio {b / a:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
