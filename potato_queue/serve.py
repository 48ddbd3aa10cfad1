"""The long-running processes: the server (uvicorn) and an executor (a Celery worker)."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import redis

from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.keys import Keys
from potato_queue.potato_hook import TRAINER_NAME
from potato_queue.redis_plumbing import client_for, refresh_forever
from potato_queue.store import RunStore

__all__ = ["serve_forever", "run_executor", "run_beat", "check_admin_key", "check_writable"]

FLUSH_CHECK_S = 2.0


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")


def check_admin_key(config: ProjectConfig, host: str) -> str:
    """What the admin API will accept, said at start: refuse a guessable key on a reachable address."""
    from potato_queue.server.guard import admin_key
    from potato_queue.validate import is_weak_admin_key

    key = admin_key(config)
    if key is None:
        return ("the admin API refuses every request: no admin key is set "
                "(set admin_api_key in the config, or POTATO_ADMIN_API_KEY)")
    if is_weak_admin_key(key) and not _loopback(host):
        raise PotatoQueueError(
            f"admin_api_key {key!r} is a placeholder anyone can guess, and {host} is reachable from other machines",
            fix="set a real key: admin_api_key in the config or POTATO_ADMIN_API_KEY (e.g. the output of "
                "python -c 'import secrets; print(secrets.token_urlsafe(24))')")
    return "the admin API is open to requests with the project's admin key (header X-API-Key)"


def check_writable(config: ProjectConfig) -> None:
    """Runs are written under the project's output folder: refuse to start when that cannot be done."""
    from potato_queue.keys import runs_dir

    folder = runs_dir(config)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise PotatoQueueError(
            f"runs cannot be written in {folder}: {exc.strerror or exc}",
            fix="make the project's output_annotation_dir writable for this account, or point it elsewhere",
        ) from None


def serve_forever(config: ProjectConfig, redis_url: str, *, host: str, port: int, public_url: str | None,
                  tls: tuple[str, str] | None = None) -> None:
    """Serve until stopped; `tls` (certificate file, key file) serves https."""
    import uvicorn

    from potato_queue.server.app import create_app, record_server_url

    check_writable(config)
    admin_state = check_admin_key(config, host)

    from potato_queue.celery_app import enqueue, make_celery

    celery = make_celery(config, redis_url)
    app = create_app(config, redis_url, enqueue=lambda run_id: enqueue(celery, config, run_id))
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit this; without it every small reply waits on a 40 ms delayed ACK.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections wait in the backlog until uvicorn accepts them
    bound_port = sock.getsockname()[1]
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    url = public_url or f"{'https' if tls else 'http'}://{reach}:{bound_port}"
    record_server_url(app.state.store, url)
    print(f"potato-queue: serving {config.annotation_task_name or config.config_path} at {url}", flush=True)
    print(f"potato-queue: {admin_state}", flush=True)
    certfile, keyfile = tls or (None, None)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                                           ssl_certfile=certfile, ssl_keyfile=keyfile))
    handle_exit = server.handle_exit

    def stopping(sig: int, frame: Any) -> None:
        app.state.stopping.set()  # the Training page's event streams end, so the shutdown need not wait on them
        handle_exit(sig, frame)

    server.handle_exit = stopping  # type: ignore[method-assign]
    server.run(sockets=[sock])


def _reconcile_forever(store: RunStore, enqueue: Callable[[str], None]) -> None:
    """Requeue runs from disk whenever Redis comes back empty (restarted or flushed),
    and fail runs a dead executor left in flight."""
    from potato_queue.runs.recovery import reconcile, sweep_orphans

    while True:
        try:
            if store.first_look_since_empty():
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
    refresh_forever(lambda: store.record_executor(name, EXECUTOR_TTL_S), EXECUTOR_REFRESH_S, "alive")


RETRAIN_EVERY_S = 60.0


def run_beat(config: ProjectConfig, redis_url: str, *, every_s: float = RETRAIN_EVERY_S, verbose: bool = False) -> None:
    """Celery beat sending the auto-retrain check every every_s; the executors run it. Its schedule is
    kept in memory (celery.beat:Scheduler): the default one writes celerybeat-schedule into the working
    directory, and a fixed interval has nothing worth keeping."""
    from potato_queue.celery_app import make_celery, schedule_retrain

    settings = config.model_training.auto_retrain
    if not settings.enabled or not settings.trainer:
        raise PotatoQueueError(
            f"auto-retrain is off in {config.config_path}: beat has nothing to schedule",
            fix="set model_training.auto_retrain.enabled: true and its trainer, or do not run beat", exit_code=2)
    if settings.trainer == TRAINER_NAME:
        raise PotatoQueueError(
            f"auto-retrain of this project is Potato's: model_training.auto_retrain.trainer is {TRAINER_NAME} in "
            f"{config.config_path}, so Potato's own server starts each run (queued here through that trainer), and a "
            "beat would start every run twice",
            fix="do not run beat for this project (up does not start it), or name one of potato-queue's trainers "
                "there to let beat schedule instead", exit_code=2)
    app = make_celery(config, redis_url)
    schedule_retrain(app, config, every_s)
    print(f"potato-queue beat: an auto-retrain check every {every_s:g} s (trainer {settings.trainer}, "
          f"after {settings.update_frequency} new annotations, at most every {settings.min_interval_s:g} s)",
          flush=True)
    app.Beat(scheduler="celery.beat:Scheduler", loglevel="INFO" if verbose else "WARNING",
             quiet=not verbose).run()


def _say(text: str) -> None:
    print(text, flush=True)


def _say_nothing(text: str) -> None:
    pass


def run_executor(config: ProjectConfig, redis_url: str, *, verbosity: int = 1,
                 visibility_timeout_s: float | None = None) -> None:
    """An executor. verbosity 0: errors only; 1: a line per run; 2: Celery's banner and info log too.
    visibility_timeout_s: the broker redelivers a message unacked this long (None: celery_app's default)."""
    from potato_queue.celery_app import enqueue, make_celery
    from potato_queue.tasks.retrain import register_retrain
    from potato_queue.tasks.runs import register

    check_writable(config)
    app = make_celery(config, redis_url, visibility_timeout_s=visibility_timeout_s)
    say = _say_nothing if verbosity == 0 else _say
    register(app, config, redis_url, say=say)
    store = RunStore(config, client_for(redis_url))
    args = (store, lambda run_id: enqueue(app, config, run_id))
    register_retrain(app, config, *args, say=say)
    threading.Thread(target=_reconcile_forever, args=args, daemon=True, name="reconcile").start()
    _say_alive(store)
    # solo pool: the run is supervised in this process, so killing the
    # executor takes its supervision with it (the agent then sees EOF on stdin).
    from celery.exceptions import SecurityWarning

    if verbosity < 2:
        # Celery's banner, and its warning that a worker runs as root (our workers run no pickled tasks,
        # and the runs themselves get an allow-listed environment), would drown what an admin reads.
        warnings.filterwarnings("ignore", category=SecurityWarning)
    app.worker_main([
        *([] if verbosity >= 2 else ["--quiet"]),
        "worker", "--pool=solo", "--concurrency=1", "--prefetch-multiplier=1", "-Q", Keys.of(config).queue,
        f"--loglevel={'INFO' if verbosity >= 2 else 'WARNING' if verbosity else 'ERROR'}", "--without-gossip",
        "--without-mingle", "-n", f"potato-queue-{os.getpid()}@%h",
    ])
