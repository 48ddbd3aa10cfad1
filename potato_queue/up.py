"""`potato-queue up`: everything on this machine, for a laptop or the README's demo.

Uses the configured Redis when one answers, else starts a private one on a
unix socket; then the server, one executor and (with auto_retrain enabled)
beat as child processes. With
--run it queues one training run, follows it, prints the held-out scores
and stops everything; without, it runs until Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from potato_queue.config import REDIS_URL_ENV, ProjectConfig
from potato_queue.embedded_redis import EmbeddedRedis, ping
from potato_queue.validate import WARNINGS_SHOWN_ENV

__all__ = ["up"]


def _spawn(args: list[str], env: dict[str, str], **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "potato_queue.cli", *args], env=env, text=True,
                            start_new_session=True, **kw)  # type: ignore[call-overload]


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _pass_on(stream: IO[str]) -> None:
    for line in stream:
        print(line.rstrip("\n"), flush=True)


def _exit_on(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def up(config: ProjectConfig, redis_url: str, *, trainer: str | None, schemas: list[str], port: int,
       verbose: bool = False) -> int:
    # SIGTERM and SIGHUP would end this process at once, leaving the server, the executor and Redis
    # running under PID 1: as SystemExit they unwind the stack below, which stops every child.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on)
    try:
        return _up(config, redis_url, trainer=trainer, schemas=schemas, port=port, verbose=verbose)
    except KeyboardInterrupt:
        return 130


def _up(config: ProjectConfig, redis_url: str, *, trainer: str | None, schemas: list[str], port: int,
        verbose: bool) -> int:
    with ExitStack() as stack:
        if not ping(redis_url):
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="potato-queue-redis-"))
            redis = stack.enter_context(EmbeddedRedis(Path(folder)))
            redis_url = redis.url
            print(f"potato-queue: no Redis answered, so one runs privately at {redis_url}", flush=True)
        env = {**os.environ, REDIS_URL_ENV: redis_url, WARNINGS_SHOWN_ENV: str(config.config_path.resolve())}
        cfg_path = str(config.config_path)
        server = _spawn(["serve", cfg_path, "--port", str(port)], env, stdout=subprocess.PIPE)
        stack.callback(_stop, server)
        assert server.stdout is not None
        print(server.stdout.readline().strip(), flush=True)  # where it serves
        # The rest of what it prints, passed on (and the pipe never fills).
        threading.Thread(target=_pass_on, args=(server.stdout,), daemon=True).start()
        executor = _spawn(["worker", cfg_path, "--verbose" if verbose else "--quiet"], env)
        stack.callback(_stop, executor)
        if trainer is None:
            if config.model_training.auto_retrain.enabled:
                stack.callback(_stop, _spawn(["beat", cfg_path], env))
            return executor.wait()
        args = ["training", "run", cfg_path, "--trainer", trainer, "--follow"]
        for schema in schemas:
            args += ["--schema", schema]
        return subprocess.call([sys.executable, "-m", "potato_queue.cli", *args], env=env)
    return 0
