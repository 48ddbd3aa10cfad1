"""P1, P4, P7 on the agent backend, each against the real alternative in the same run.

    .venv/bin/python bench/bench_agent.py p1 [--runs 20]        cancel -> SIGTERM at the worker, p95 (goal <= 100 ms)
    .venv/bin/python bench/bench_agent.py p4 [--mb 1024]        the agent's bundle download vs curl from a static server
    .venv/bin/python bench/bench_agent.py p7 [--agents 1000]    idle agents long-polling: RSS, CPU, claim p99
    .venv/bin/python bench/bench_agent.py all
    .venv/bin/python bench/bench_agent.py all --quick   seconds: majority-baseline's hold for P1, one P7 stack

Everything is real: a private Redis, `potato-queue serve` and `worker`,
`potato-queue training agent` (P1), the agent's own download code (P4) and
raw HTTP long-polls from one asyncio process standing for many agents (P7).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_lifecycle import cancel_s, hand_cancel_s, p95, report  # noqa: E402

from bench.long_runs import HF, HOLD, trainer_arg, until_stopped  # noqa: E402
from bench.quick import quick_args  # noqa: E402
from potato_queue.processes.embedded_redis import EmbeddedRedis  # noqa: E402
from tests.lifecycle_helpers import Services, run_paths, started  # noqa: E402

BACKEND = "lab"
AGENT_BACKENDS = {"backends": {BACKEND: {"type": "agent", "heartbeat_timeout_s": 60}}}


@contextmanager
def services(tmp: Path, executors: int = 1, **training: Any) -> Iterator[Services]:
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        url = stack.enter_context(EmbeddedRedis(folder)).url
        yield stack.enter_context(started(tmp, url, executors, grace_seconds=5, **AGENT_BACKENDS, **training))


def register(svc: Services) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "potato_queue.cli", "training", "register", BACKEND, str(svc.config)],
        env=svc.env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines()[2].strip()


def run_dir(svc: Services, run_id: str) -> Path:
    return run_paths(svc, run_id).dir


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- P1: cancel on the agent backend


def p1(tmp: Path, runs: int, args: argparse.Namespace) -> None:
    trainer = args.trainer or HF
    params = until_stopped(tmp, trainer)
    with services(tmp / "p1") as svc:
        env = {**os.environ, "POTATO_TRAINING_TOKEN": register(svc)}
        agent = subprocess.Popen(
            [sys.executable, "-m", "potato_queue.cli", "training", "agent", "--server", svc.url]
            + ["--backend", BACKEND, "--workdir", str(tmp / "agent")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            ours, run_id = cancel_s(svc, params, runs, trainer, backend=BACKEND)
        finally:
            os.killpg(agent.pid, signal.SIGTERM)
            agent.wait(30)
        hand = hand_cancel_s(tmp, run_dir(svc, run_id) / "bundle", params, runs, trainer)  # the last run's bundle
    report("P1 (agent backend)", p95(ours), p95(hand), "s", f"cancel -> worker stops, p95 of {runs}", "<= 0.100 s")


# ---------------------------------------------------------------- P4: the bundle download


def _big_file(path: Path, mb: int) -> str:
    digest = hashlib.sha256()
    block = os.urandom(1 << 20)
    with open(path, "wb") as fh:
        for i in range(mb):
            chunk = block[i % 997 :] + block[: i % 997]  # no two blocks alike: gzip-like, incompressible
            fh.write(chunk)
            digest.update(chunk)
    return digest.hexdigest()


# The agent's own download code (potato_queue.agent.client), run as the agent runs it; the token from
# the environment, never argv.
AGENT_DOWNLOAD = """
import os, sys
from potato_queue.agent.client import AgentClient
server, run_id, dest, size, sha256 = sys.argv[1:]
AgentClient(server, run_id, os.environ["POTATO_TRAINING_TOKEN"]).download_bundle(dest, int(size), sha256)
"""


ROUNDS = 12  # of each P4 download; a multiple of its 4 rows, so that each goes first as often


def p4(tmp: Path, mb: int, _: argparse.Namespace) -> None:
    with services(tmp / "p4", executors=0) as svc:
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        bundle = run_dir(svc, run_id) / "bundle.tar.gz"
        sha256 = _big_file(bundle, mb)
        os.sync()  # written back to disk before anything is timed: both read it from the page cache
        subprocess.run(["cat", str(bundle)], stdout=subprocess.DEVNULL, check=True)
        import redis

        from potato_queue.store import RunStore
        from potato_queue.validate import load_checked

        token = RunStore(load_checked(svc.config), redis.Redis.from_url(svc.redis_url)).tokens.issue(run_id, 3600)
        static = subprocess.Popen(
            [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(bundle.parent)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert static.stdout is not None
            port = static.stdout.readline().split("port ")[1].split()[0]
            ours, theirs = [], []

            def agent_download(dest: Path) -> None:  # a process of its own, as the agent and curl are
                subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        AGENT_DOWNLOAD,
                        svc.url,
                        run_id,
                        str(dest),
                        str(bundle.stat().st_size),
                        sha256,
                    ],
                    env={**os.environ, "POTATO_TRAINING_TOKEN": token},
                    cwd=ROOT,
                    check=True,
                )

            def curl(dest: Path) -> None:
                subprocess.run(["curl", "-fsS", "-o", str(dest), f"http://127.0.0.1:{port}/bundle.tar.gz"], check=True)

            header = tmp / "auth.header"  # the token in a file, not on curl's command line
            header.write_text(f"Authorization: Bearer {token}\n")
            via_ours: list[float] = []

            def curl_ours(dest: Path) -> None:
                subprocess.run(
                    [
                        "curl",
                        "-fsS",
                        "-o",
                        str(dest),
                        "-H",
                        f"@{header}",
                        f"{svc.url}/api/training/agent/v1/runs/{run_id}/bundle",
                    ],
                    check=True,
                )

            verified: list[float] = []

            def curl_and_check(dest: Path) -> None:  # what an admin does to get a file it can trust
                curl(dest)
                out = subprocess.run(["sha256sum", str(dest)], capture_output=True, text=True, check=True).stdout
                assert out.split()[0] == sha256

            rows = [
                ("agent", agent_download, ours),
                ("curl", curl, theirs),
                ("curl-ours", curl_ours, via_ours),
                ("curl-sha256sum", curl_and_check, verified),
            ]
            for i in range(ROUNDS):  # rotating who goes first: the page cache's write-back treats them alike
                for name, fetch, took in rows[i % 4 :] + rows[: i % 4]:
                    dest = tmp / f"{name}-{i}.tar.gz"
                    os.sync()  # the last download's dirty pages written back first
                    started_s = time.perf_counter()
                    fetch(dest)
                    took.append(time.perf_counter() - started_s)
                    dest.unlink()
        finally:
            static.terminate()
            static.wait()
    from potato_queue.agent.client import file_sha256

    started_s = time.perf_counter()
    file_sha256(str(bundle)) if bundle.exists() else None
    sha_mbs = mb / (time.perf_counter() - started_s)
    # Best of ROUNDS and the median: on a VM the host's paging adds noise to every side's kernel time.
    rates = {name: (mb / min(took), mb / statistics.median(took)) for name, _, took in rows}
    print(
        f"P4: {mb} MB bundle, MB/s best / median of {ROUNDS}: "
        + ", ".join(f"{name} {best:.0f} / {median:.0f}" for name, (best, median) in rates.items()),
        flush=True,
    )
    for against in ("curl", "curl-sha256sum"):
        print(
            f"P4: agent (download + sha256 check) vs {against}: ratio {rates['agent'][0] / rates[against][0]:.2f} "
            f"best, {rates['agent'][1] / rates[against][1]:.2f} median"
            + (" (goal >= 0.9x)" if against == "curl" else ""),
            flush=True,
        )
    print(
        f"P4: sha256 alone on this CPU {sha_mbs:.0f} MB/s (the agent must verify what it got, AGT-5); curl is "
        "from a plain static server, curl-ours from potato-queue's bundle route",
        flush=True,
    )


# ---------------------------------------------------------------- P7: idle agents


async def _long_poll(
    host: str, port: int, token: str, stop: asyncio.Event, claims: asyncio.Queue[Any], delay_s: float, wait_s: float
) -> None:
    """One idle agent: claim, wait, claim again; a run it gets is reported at once as failed (exit 1)."""
    await asyncio.sleep(delay_s)  # thousands of agents do not all connect in the same millisecond
    body = json.dumps({"host": "bench", "python": "3.11"}).encode()
    head = (
        f"POST /api/training/agent/v1/backends/{BACKEND}/claim?wait_s={wait_s:g} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while not stop.is_set():
            writer.write(head.encode() + body)
            await writer.drain()
            status_line = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reply = json.loads(await reader.readexactly(length)) if length else {}
            if b" 200 " in status_line and reply.get("run_id"):
                await claims.put((time.time(), reply))
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


def _report_failed(url: str, claim: dict[str, Any]) -> None:
    import urllib.request

    req = urllib.request.Request(
        f"{url}/api/training/agent/v1/runs/{claim['run_id']}/result",
        method="POST",
        data=json.dumps({"exit_code": 1, "message": "bench"}).encode(),
        headers={"Authorization": f"Bearer {claim['token']}", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=30).read()


async def _idle_agents(
    svc: Services, token: str, agents: int, runs: int, wait_s: float, window_s: float | None
) -> dict[str, float]:
    """The server's idle CPU and memory under `agents` claiming, then the claim latency of `runs` runs. The
    idle window is a whole poll (every agent's reconnect in it) unless `window_s` sets it (--quick)."""
    parts = urllib.parse.urlsplit(svc.url)
    stop, claims = asyncio.Event(), asyncio.Queue()
    # Spread over one poll's length, as agents started at different times are: the reconnects are steady.
    tasks = [
        asyncio.create_task(_long_poll(parts.hostname, parts.port, token, stop, claims, i * wait_s / agents, wait_s))
        for i in range(agents)
    ]
    server = svc.procs[0].pid
    await asyncio.sleep(wait_s + 5 if window_s is None else window_s)  # all connected, each reconnecting once a poll
    cpu_before, idle_started = cpu_s(server), time.monotonic()
    await asyncio.sleep(max(30.0, wait_s) if window_s is None else window_s)
    idle_cpu = (cpu_s(server) - cpu_before) / (time.monotonic() - idle_started)
    idle_rss = rss_mb(server)
    latencies = []
    for _ in range(runs):
        posted = time.time()
        await asyncio.to_thread(svc.start_run, trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        claimed_at, claim = await asyncio.wait_for(claims.get(), 60)
        latencies.append(claimed_at - posted)
        await asyncio.to_thread(_report_failed, svc.url, claim)
        await asyncio.to_thread(svc.wait_for, claim["run_id"], {"failed", "succeeded", "cancelled"})
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    ordered = sorted(latencies)
    return {
        "rss_mb": idle_rss,
        "cpu": idle_cpu,
        "p99_s": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "median_s": statistics.median(latencies),
    }


def _p7_row(svc: Services, token: str, count: int, wait_s: float, runs: int, window_s: float | None) -> float:
    """One row of P7, printed; its idle CPU."""
    base_rss = rss_mb(svc.procs[0].pid)
    row = asyncio.run(_idle_agents(svc, token, count, runs=runs, wait_s=wait_s, window_s=window_s))
    print(
        f"P7: {count} idle agents, {wait_s:g} s claims, one server: RSS {row['rss_mb']:.0f} MB ({base_rss:.0f} MB "
        f"with none; goal < 500 MB at 10,000), idle CPU {row['cpu']:.1%} of a core (goal < 10 %), claim "
        f"latency from POST /runs: median {row['median_s'] * 1000:.0f} ms, p99 {row['p99_s'] * 1000:.0f} ms "
        f"over {runs} runs (goal < 200 ms)",
        flush=True,
    )
    return row["cpu"]


def p7(tmp: Path, agents: int, args: argparse.Namespace) -> None:
    """The agent's own claim (CLAIM_WAIT_S) at `agents` and ten times as many; side by side at the larger
    count, a plain 25-second poll loop (what the agent did before, and what most pollers do). --window-s,
    --claim-runs and --one-stack (each row on the first row's server, not a fresh one) shorten it."""
    from potato_queue.agent.backend import CLAIM_WAIT_S

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the server, started below, inherits it
    cpu: dict[tuple[int, float], float] = {}
    with ExitStack() as shared:
        one = None
        if args.one_stack:
            one = shared.enter_context(services(tmp / "p7"))
            one_token = register(one)
        for count, wait_s in [(agents, CLAIM_WAIT_S), (10 * agents, CLAIM_WAIT_S), (10 * agents, 25.0)]:
            if count + 500 > hard:  # each side (this process, the server) holds one socket per agent
                print(f"P7: {count} agents need {count + 500} open files; the hard limit here is {hard}", flush=True)
                continue
            if one is not None:
                cpu[count, wait_s] = _p7_row(one, one_token, count, wait_s, args.claim_runs, args.window_s)
                continue
            with services(tmp / f"p7-{count}-{wait_s:g}") as svc:
                cpu[count, wait_s] = _p7_row(svc, register(svc), count, wait_s, args.claim_runs, args.window_s)
    ours, plain = cpu.get((10 * agents, CLAIM_WAIT_S)), cpu.get((10 * agents, 25.0))
    if ours is not None and plain is not None:  # 0.0 is a figure too (a short --quick window)
        ratio = f"{ours / plain:.2f}" if plain else "n/a (the polls took no CPU that could be measured)"
        print(
            f"P7: idle CPU at {10 * agents} agents, the agent's {CLAIM_WAIT_S:g} s claims vs 25 s polls: ratio {ratio}",
            flush=True,
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# name: (bench, its size: runs, MB or agents, the size of --quick)
BENCHES = {"p1": (p1, 20, 1), "p4": (p4, 1024, 4), "p7": (p7, 1000, 20)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=[*BENCHES, "all"])
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--mb", type=int, default=None)
    parser.add_argument("--agents", type=int, default=None)
    trainer_arg(parser, "P1's cancelled runs")
    parser.add_argument("--window-s", type=float, default=None, help="P7's settle and idle windows (default a poll)")
    parser.add_argument("--claim-runs", type=int, default=20, help="P7's runs claimed, per row")
    parser.add_argument("--one-stack", action="store_true", help="P7's rows on one server")
    args = quick_args(parser, trainer=HOLD, window_s=0.5, claim_runs=3, one_stack=True)
    for name in BENCHES if args.which == "all" else [args.which]:
        bench, default, quick = BENCHES[name]
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
            bench(Path(tmp), args.runs or args.mb or args.agents or (quick if args.quick else default), args)


if __name__ == "__main__":
    threading.stack_size(1 << 20)
    main()
