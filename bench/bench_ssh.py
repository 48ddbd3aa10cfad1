"""P1, P5, P6 on the ssh backend, each against the real alternative in the same run.

    .venv/bin/python bench/bench_ssh.py p1 [--runs 20]   cancel -> the worker stops, p95 (goal <= 100 ms)
    .venv/bin/python bench/bench_ssh.py p5 [--mb 1024]   the model files back vs scp of the same files (goal >= 1.0x)
    .venv/bin/python bench/bench_ssh.py p6 [--runs 5]    a no-op run over ssh vs `ssh host true` (goal <= 3 round trips)
    .venv/bin/python bench/bench_ssh.py all
    .venv/bin/python bench/bench_ssh.py all --quick   seconds: one stack, majority-baseline's hold for P1, 4 MB

Everything is real: a real sshd on 127.0.0.1 (tests/sshd.py) is the GPU
server, with a private Redis, `potato-queue serve` and `worker`. Run as root
(the sshd logs in as root).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_lifecycle import cancel_s, hand_cancel_s, p95, report  # noqa: E402

from bench.long_runs import HF, HOLD, trainer_arg, until_stopped  # noqa: E402
from bench.quick import quick_args  # noqa: E402
from potato_queue.executors.base import LaunchSpec  # noqa: E402
from potato_queue.executors.remote.copy import ModelCopy  # noqa: E402
from potato_queue.executors.remote.session import target_of  # noqa: E402
from potato_queue.processes.embedded_redis import EmbeddedRedis  # noqa: E402
from potato_queue.settings import SSH_CONFIG_ENV, Settings  # noqa: E402
from potato_queue.store.keys import RunPaths  # noqa: E402
from tests.lifecycle_helpers import Services, run_paths, started  # noqa: E402
from tests.sshd import ALIAS, Sshd  # noqa: E402

BACKEND = "gpu-server"


@contextmanager
def over_ssh(tmp: Path, **backend: Any) -> Iterator[tuple[Services, Sshd]]:
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        sshd = Sshd(tmp / "sshd")
        stack.callback(sshd.close)
        url = stack.enter_context(EmbeddedRedis(folder)).url
        settings = {
            "type": "ssh",
            "host": ALIAS,
            "python": sys.executable,
            "gpus": "none",
            "remote_dir": str(tmp / "remote"),
            "heartbeat_timeout_s": 60,
            **backend,
        }
        svc = stack.enter_context(
            started(tmp / "project", url, executors=0, grace_seconds=5, backends={BACKEND: settings})
        )
        svc.executor(env={SSH_CONFIG_ENV: str(sshd.config)})
        yield svc, sshd


# Where a figure's stack comes from: over_ssh of its own folder, or (--one-stack) the one every figure shares.
Stack = Callable[[Path], AbstractContextManager[tuple[Services, Sshd]]]


def run_dir(svc: Services, run_id: str) -> Path:
    return run_paths(svc, run_id).dir


# ---------------------------------------------------------------- P1: cancel over ssh


def p1(tmp: Path, runs: int, args: argparse.Namespace, stack: Stack) -> None:
    trainer = args.trainer or HF
    params = until_stopped(tmp, trainer)
    with stack(tmp / "p1") as (svc, _sshd):
        ours, run_id = cancel_s(svc, params, runs, trainer, backend=BACKEND)
        hand = hand_cancel_s(tmp, run_dir(svc, run_id) / "bundle", params, runs, trainer)
    report("P1 (ssh backend)", p95(ours), p95(hand), "s", f"cancel -> worker stops, p95 of {runs}", "<= 0.100 s")


# ---------------------------------------------------------------- P5: the model files back


def _model_files(work: Path, mb: int) -> None:
    """`mb` MB of incompressible model files in four pieces, as a fine-tuned model's shards."""
    work.mkdir(parents=True)
    block = os.urandom(1 << 20)
    for shard in range(4):
        with open(work / f"model-{shard}.safetensors", "wb") as fh:
            for i in range(mb // 4):
                fh.write(block[i % 991 :] + block[: i % 991])


def _copy_back(svc: Services, sshd: Sshd, job: Path, dest: Path) -> None:
    """potato-queue's copy of a job's model files (the same _Copy a run's collect uses)."""
    from potato_queue.config import SshBackend

    backend = SshBackend(
        host=ALIAS, python=sys.executable, remote_dir=str(job.parent.parent), keep_remote=True, max_artifact_mb=1e9
    )
    spec = LaunchSpec(
        run_id=job.name,
        backend_name=BACKEND,
        job={},
        token=None,
        server_url=svc.url,
        paths=RunPaths(dest),
        log=lambda _line: None,
        step=lambda _line: None,
    )
    dest.mkdir()
    ModelCopy(target_of(backend, Settings(ssh_config_file=str(sshd.config))), backend, spec, str(job)).run()


def p5(tmp: Path, mb: int, args: argparse.Namespace, stack: Stack) -> None:
    with stack(tmp / "p5") as (svc, sshd):
        job = tmp / "p5" / "remote" / "jobs" / "bench-job"
        _model_files(job / "work", mb)
        ours, theirs = [], []
        for i in range(args.copies):  # alternating who goes first
            for name, took in (("ours", ours), ("scp", theirs))[:: 1 if i % 2 == 0 else -1]:
                dest = tmp / f"{name}-{i}"
                os.sync()
                started_s = time.perf_counter()
                if name == "ours":
                    _copy_back(svc, sshd, job, dest)
                else:
                    subprocess.run(
                        ["scp", "-q", "-r", "-F", str(sshd.config), f"{ALIAS}:{job}/work", str(dest)], check=True
                    )
                took.append(time.perf_counter() - started_s)
                subprocess.run(["rm", "-rf", str(dest)], check=True)
    ours_mbs, scp_mbs = mb / statistics.median(ours), mb / statistics.median(theirs)
    print(
        f"P5: {mb} MB of model files back over ssh: potato-queue {ours_mbs:.0f} MB/s, scp {scp_mbs:.0f} MB/s "
        f"(median of {args.copies}), ratio {ours_mbs / scp_mbs:.2f} (goal >= 1.0x, floor 0.9x)",
        flush=True,
    )


# ---------------------------------------------------------------- P6: a no-op run's overhead


def p6(tmp: Path, runs: int, _args: argparse.Namespace, stack: Stack) -> None:
    with stack(tmp / "p6") as (svc, sshd):
        started_s = time.perf_counter()
        svc.wait_for(
            svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND), {"succeeded"}, 120
        )  # the code is on the host from now on
        first_s = time.perf_counter() - started_s
        over_ssh_s, local_s, true_s = [], [], []
        for _ in range(runs):
            for backend, took in ((BACKEND, over_ssh_s), ("local", local_s)):
                started_s = time.perf_counter()
                run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=backend)
                svc.wait_for(run_id, {"succeeded"}, 120)
                took.append(time.perf_counter() - started_s)
            started_s = time.perf_counter()
            subprocess.run(["ssh", "-F", str(sshd.config), ALIAS, "true"], check=True)
            true_s.append(time.perf_counter() - started_s)
    ssh_run, local_run, round_trip = (statistics.median(x) for x in (over_ssh_s, local_s, true_s))
    print(
        f"P6: a no-op run (majority-baseline), median of {runs}: over ssh {ssh_run:.2f} s, local {local_run:.2f} s, "
        f"`ssh host true` {round_trip:.3f} s; ssh's overhead {ssh_run - local_run:.2f} s = "
        f"{(ssh_run - local_run) / round_trip:.1f} round trips (goal <= 3); the first run, which copied the "
        f"code, {first_s:.2f} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("which", choices=["p1", "p5", "p6", "all"])
    parser.add_argument("--runs", type=int)
    parser.add_argument("--mb", type=int)
    trainer_arg(parser, "P1's cancelled runs")
    parser.add_argument("--copies", type=int, default=6, help="P5's copies each way")
    parser.add_argument("--one-stack", action="store_true", help="one sshd, server and executor for every figure")
    args = quick_args(parser, trainer=HOLD, copies=2, one_stack=True)
    with ExitStack() as shared:
        stack: Stack = over_ssh
        if args.one_stack:
            one = shared.enter_context(over_ssh(Path(shared.enter_context(tempfile.TemporaryDirectory()))))

            def the_one(_tmp: Path) -> AbstractContextManager[tuple[Services, Sshd]]:
                return nullcontext(one)

            stack = the_one
        for name, bench, default, quick in (("p1", p1, 20, 1), ("p5", p5, 1024, 4), ("p6", p6, 5, 1)):
            if args.which in (name, "all"):
                with tempfile.TemporaryDirectory(prefix=f"bench-ssh-{name}-") as tmp:
                    size = (args.mb if name == "p5" else args.runs) or (quick if args.quick else default)
                    bench(Path(tmp), size, args, stack)


if __name__ == "__main__":
    main()
