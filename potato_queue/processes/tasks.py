"""The executor's two Celery tasks, each a few lines around the run code: execute (runs.dispatch) and the
auto-retrain check (runs.retrain) that beat sends."""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery

from potato_queue.config import ProjectConfig
from potato_queue.processes.queue import EXECUTE_TASK, RETRAIN_TASK
from potato_queue.store import RunStore
from potato_queue.store.plumbing import SUPERVISION_SOCKET_TIMEOUT_S, client_for

__all__ = ["register_execute", "register_retrain"]


def register_execute(app: Celery, config: ProjectConfig, redis_url: str, *, say: Callable[[str], None]) -> None:
    """Bind execute(run_id) to this project's config (the worker process has one); `say` prints a line per
    wake-up (the process decides whether it shows: `worker --quiet` hands in one that drops it)."""
    from potato_queue.runs.dispatch import Dispatcher

    dispatcher = Dispatcher(config, client_for(redis_url, socket_timeout_s=SUPERVISION_SOCKET_TIMEOUT_S))

    @app.task(name=EXECUTE_TASK, acks_late=True)
    def execute(run_id: str) -> None:
        # One line per delivery: a message delivered again shows up here twice. The run that
        # starts is the oldest queued one, which need not be the one this message named.
        say(f"potato-queue: woken for run {run_id}")
        ran = dispatcher.execute_next()
        say(f"potato-queue: ran {ran}" if ran else "potato-queue: nothing queued to run")


def register_retrain(
    app: Celery, config: ProjectConfig, store: RunStore, enqueue: Callable[[str], None], say: Callable[[str], None]
) -> None:
    """Bind the auto-retrain check: beat sends it every few seconds; an idle executor runs one check."""
    from potato_queue.runs.retrain import check

    @app.task(name=RETRAIN_TASK, ignore_result=True)
    def auto_retrain() -> None:
        decision = check(config, store, enqueue)
        if decision is not None and decision.start:
            say(f"potato-queue: auto-retrain {decision.reason}")
