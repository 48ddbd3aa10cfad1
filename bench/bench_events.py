"""P8: events relayed per second, worker -> agent -> server -> events.jsonl + Redis.

A scripted worker emits N metric events as fast as it can. Run 1 starts it
by hand with stdout to /dev/null (the ceiling: what the worker alone can
write). Run 2 runs it under the real agent (`python -m potato_queue.agent
run`, token on stdin) talking to the real agent routes (uvicorn, in this
process) and a real Redis. Both rates and their ratio are printed; the target
is >= 10,000 events/s relayed.

    .venv/bin/python bench/bench_events.py [--events 200000] [--unix] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import uvicorn  # noqa: E402

from bench.quick import quick_args  # noqa: E402
from potato_queue.config import ProjectConfig, build_config  # noqa: E402
from potato_queue.runs.job import heartbeat_interval_s, max_predictions_bytes  # noqa: E402
from potato_queue.server.app import create_app  # noqa: E402
from potato_queue.settings import Settings  # noqa: E402
from potato_queue.store import RunStore  # noqa: E402
from potato_queue.store.keys import Keys  # noqa: E402
from potato_queue.wire.job import BundleRef, Job, Limits  # noqa: E402

__all__ = ["main"]

FLOOD_WORKER = r'''#!{python}
"""Emits params.n metric events as fast as it can, then a result (a stand-in for a chatty trainer)."""
import json, os, sys, time
spec = json.load(open(sys.argv[sys.argv.index("--spec") + 1]))
n, out = spec["params"]["n"], sys.stdout
started = time.time()
for i in range(n):
    out.write(json.dumps({"v": 1, "event": "metric", "t": time.time(), "split": "train", "name": "loss",
                          "value": 1.0 / (i + 1), "step": i}) + "\n")
out.write(json.dumps({"v": 1, "event": "result", "t": time.time(), "status": "success"}) + "\n")
out.flush()
with open(os.path.join(spec["workdir"], "times.json"), "w") as fh:
    json.dump({"started": started, "ended": time.time()}, fh)
'''


def _tiny_bundle() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name in ("train.jsonl", "val.jsonl", "test.jsonl", "manifest.json", "labels.json"):
            data = b"{}\n"
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _serve(config: ProjectConfig, unix_path: str) -> tuple[uvicorn.Server, RunStore, str]:
    """The real app (create_app), as `potato-queue serve` makes it: a copy of its wiring went stale unseen."""
    app = create_app(config, Settings.from_env(os.environ).redis_url, enqueue=lambda run_id: None)
    tcp = socket.socket(
        socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )  # proto set: asyncio then sets TCP_NODELAY
    tcp.bind(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, kwargs={"sockets": [tcp, unix]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, app.state.store, f"http://127.0.0.1:{tcp.getsockname()[1]}"


def _new_run(store: RunStore, config: ProjectConfig, n: int) -> tuple[str, str]:
    run_id = store.create(trainer="flood", schemas=["s"], backend="local", params={"n": n})["run_id"]
    data = _tiny_bundle()
    store.paths(run_id).bundle.write_bytes(data)
    # The job's one shape (wire/job.py), as runs/job.py builds it: a hand-written dict went stale unseen.
    job = Job(
        run_id=run_id,
        trainer="flood",
        schemas=["s"],
        params={"n": n},
        seed=0,
        grace_seconds=5,
        bundle=BundleRef(len(data), hashlib.sha256(data).hexdigest()),
        limits=Limits(device="cpu"),
        heartbeat_interval_s=heartbeat_interval_s(config, "local"),
        max_predictions_bytes=max_predictions_bytes(config),
    )
    store.update(run_id, job=job.to_dict())
    store.transition(run_id, "starting")
    store.transition(run_id, "running")
    return run_id, store.tokens.issue(run_id, ttl_s=3600)


def by_hand(worker: Path, n: int, tmp: Path) -> float:
    """Events/s of the worker alone, stdout to /dev/null."""
    work = tmp / "by-hand"
    work.mkdir()
    spec = tmp / "spec-by-hand.json"
    spec.write_text(json.dumps({"v": 1, "params": {"n": n}, "workdir": str(work)}))
    with open(os.devnull, "wb") as null:
        subprocess.run([str(worker), "-m", "potato_queue.worker", "--spec", str(spec)], stdout=null, check=True)
    times = json.loads((work / "times.json").read_text())
    return n / (times["ended"] - times["started"])


def relayed(store: RunStore, config: ProjectConfig, url: str, worker: Path, n: int, tmp: Path) -> float:
    """Events/s from the worker's first event to the agent's exit (every event stored by then)."""
    run_id, token = _new_run(store, config, n)
    log = tmp / "agent.log"
    with open(log, "wb") as err:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "potato_queue.agent",
                "run",
                "--server",
                url,
                "--run-id",
                run_id,
                "--workdir",
                str(tmp / "agent"),
                "--python",
                str(worker),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=ROOT,
        )
    assert agent.stdin is not None
    agent.stdin.write(token.encode() + b"\n")
    agent.stdin.flush()  # kept open as the executors do: its end would stop the run
    code = agent.wait()
    finished = time.time()
    agent.stdin.close()
    if code != 0:
        raise SystemExit(f"the agent failed ({code}):\n{log.read_text()}")
    started = json.loads((tmp / "agent" / run_id / "work" / "times.json").read_text())["started"]
    with open(store.paths(run_id).events, "rb") as fh:
        stored = sum(1 for line in fh if b'"metric"' in line)
    if stored != n:
        raise SystemExit(f"only {stored} of {n} events were stored")
    return n / (finished - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--unix", action="store_true", help="the agent talks through the unix socket")
    args = quick_args(parser, argv, events=2_000)
    with tempfile.TemporaryDirectory(prefix="pq-bench-") as folder:
        tmp = Path(folder)
        config = build_config(
            {"annotation_task_name": "bench", "task_dir": str(tmp / "project")}, tmp / "project" / "config.yaml"
        )
        worker = tmp / "flood-python"
        worker.write_text(FLOOD_WORKER.replace("{python}", sys.executable))
        worker.chmod(0o755)
        server, store, url = _serve(config, str(tmp / "agent.sock"))
        try:
            alone = by_hand(worker, args.events, tmp)
            through = relayed(
                store, config, f"unix://{tmp / 'agent.sock'}" if args.unix else url, worker, args.events, tmp
            )
        finally:
            server.should_exit = server.force_exit = True
            keys = list(store.redis.scan_iter(match=f"{Keys.of(config).prefix}:*"))
            if keys:
                store.redis.delete(*keys)
    print(f"events:                 {args.events}")
    print(f"worker to /dev/null:    {alone:,.0f} events/s")
    print(f"relayed (agent+server): {through:,.0f} events/s ({'unix socket' if args.unix else 'tcp'})")
    print(f"ratio relayed/by hand:  {through / alone:.2f}")


if __name__ == "__main__":
    main()
