"""The auto-retrain task: beat sends it every few seconds; an idle executor runs one check."""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery

from potato_queue.celery_app import RETRAIN_TASK
from potato_queue.config import ProjectConfig
from potato_queue.store import RunStore

__all__ = ["register_retrain"]


def register_retrain(app: Celery, config: ProjectConfig, store: RunStore, enqueue: Callable[[str], None],
                     say: Callable[[str], None]) -> None:
    from potato_queue.runs.retrain import check

    @app.task(name=RETRAIN_TASK, ignore_result=True)
    def auto_retrain() -> None:
        decision = check(config, store, enqueue)
        if decision is not None and decision.start:
            say(f"potato-queue: auto-retrain {decision.reason}")
