"""An executor: a Celery worker (solo pool) that supervises one run at a time, with the threads that keep
Redis in step with the run folders and say the executor is alive."""

from __future__ import annotations

import os
import socket
import threading
import time
import warnings
from collections.abc import Callable

import redis

from potato_queue.config import ProjectConfig
from potato_queue.lab.events import endpoints
from potato_queue.processes.startup import check_writable
from potato_queue.processes.webhooks import deliver_forever
from potato_queue.store import RunStore
from potato_queue.store.keys import Keys
from potato_queue.store.plumbing import client_for, refresh_forever

__all__ = ["run_executor"]

FLUSH_CHECK_S = 2.0


def _reconcile_forever(store: RunStore, enqueue: Callable[[str], None]) -> None:
    """Requeue runs from disk whenever Redis comes back empty (restarted or flushed),
    and fail runs a dead executor left in flight."""
    from potato_queue.runs.recovery import reconcile, sweep_orphans

    while True:
        try:
            if store.presence.first_look_since_empty():
                woken = reconcile(store, enqueue)
                if woken:
                    print(f"potato-queue: queued {woken} run(s) again from disk", flush=True)
            sweep_orphans(store)
        except redis.RedisError:
            pass
        time.sleep(FLUSH_CHECK_S)


EXECUTOR_TTL_S = 15


EXECUTOR_REFRESH_S = 5.0


def _say_alive(store: RunStore) -> None:
    """This executor is up (/healthz counts them)."""
    name = f"{socket.gethostname()}:{os.getpid()}"
    refresh_forever(lambda: store.presence.record_executor(name, EXECUTOR_TTL_S), EXECUTOR_REFRESH_S, "alive")


def _say(text: str) -> None:
    print(text, flush=True)


def _say_nothing(text: str) -> None:
    pass


def run_executor(
    config: ProjectConfig, redis_url: str, *, verbosity: int = 1, visibility_timeout_s: float | None = None
) -> None:
    """An executor. verbosity 0: errors only; 1: a line per run; 2: Celery's banner and info log too.
    visibility_timeout_s: the broker redelivers a message unacked this long (None: processes/queue.py's default)."""
    from potato_queue.processes.queue import enqueue, make_celery
    from potato_queue.processes.tasks import register_execute, register_retrain

    check_writable(config)
    app = make_celery(config, redis_url, visibility_timeout_s=visibility_timeout_s)
    say = _say_nothing if verbosity == 0 else _say
    register_execute(app, config, redis_url, say=say)
    store = RunStore(config, client_for(redis_url))
    args = (store, lambda run_id: enqueue(app, config, run_id))
    register_retrain(app, config, *args, say=say)
    threading.Thread(target=_reconcile_forever, args=args, daemon=True, name="reconcile").start()
    if endpoints(config):  # the project's webhooks want training events: this executor delivers them too
        threading.Thread(target=deliver_forever, args=(config, store), daemon=True, name="webhooks").start()
    _say_alive(store)
    # solo pool: the run is supervised in this process, so killing the
    # executor takes its supervision with it (the agent then sees EOF on stdin).
    from celery.exceptions import SecurityWarning

    if verbosity < 2:
        # Celery's banner, and its warning that a worker runs as root (our workers run no pickled tasks,
        # and the runs themselves get an allow-listed environment), would drown what an admin reads.
        warnings.filterwarnings("ignore", category=SecurityWarning)
    app.worker_main(
        [
            *([] if verbosity >= 2 else ["--quiet"]),
            "worker",
            "--pool=solo",
            "--concurrency=1",
            "--prefetch-multiplier=1",
            "-Q",
            Keys.of(config).queue,
            f"--loglevel={'INFO' if verbosity >= 2 else 'WARNING' if verbosity else 'ERROR'}",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"potato-queue-{os.getpid()}@%h",
        ]
    )
