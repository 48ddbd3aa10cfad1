"""The execute task: a few lines around runs.dispatch."""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery

from potato_queue.celery_app import EXECUTE_TASK
from potato_queue.config import ProjectConfig
from potato_queue.redis_plumbing import client_for

__all__ = ["register"]


def register(app: Celery, config: ProjectConfig, redis_url: str, *, say: Callable[[str], None]) -> None:
    """Bind execute(run_id) to this project's config (the worker process has one); `say` prints a line per
    wake-up (the process decides whether it shows: `worker --quiet` hands in one that drops it)."""
    from potato_queue.runs.dispatch import Dispatcher

    dispatcher = Dispatcher(config, client_for(redis_url))

    @app.task(name=EXECUTE_TASK, acks_late=True)
    def execute(run_id: str) -> None:
        # One line per delivery: a message delivered again shows up here twice. The run that
        # starts is the oldest queued one, which need not be the one this message named.
        say(f"potato-queue: woken for run {run_id}")
        ran = dispatcher.execute_next()
        say(f"potato-queue: ran {ran}" if ran else "potato-queue: nothing queued to run")
