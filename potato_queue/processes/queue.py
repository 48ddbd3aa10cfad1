"""make_celery(config, redis_url): the queue, its settings, and the execute task.

One Celery queue per project (keys.queue). Executors run with concurrency 1,
prefetch 1 and late acks. Ordering and "one at a time" are not left to
Celery: runs/dispatch.py takes a Redis lease for the run slot and always starts
the oldest queued run, so a redelivered or duplicated message is harmless.
"""

from __future__ import annotations

from celery import Celery

from potato_queue.config import ProjectConfig
from potato_queue.store.keys import Keys

__all__ = ["EXECUTE_TASK", "RETRAIN_TASK", "make_celery", "kombu_url", "enqueue", "schedule_retrain"]

EXECUTE_TASK = "potato_queue.execute"
RETRAIN_TASK = "potato_queue.auto_retrain"
# The Redis transport redelivers a message unacked for longer than this.
# Runs may last days; execute() is idempotent, so the cost of a redelivery
# is only a wake-up. Thirty days is above any run we expect.
VISIBILITY_TIMEOUT_S = 30 * 24 * 3600


def kombu_url(redis_url: str) -> str:
    """redis-py's `unix:///path?db=N` is kombu's `redis+socket:///path?virtual_host=N`."""
    if redis_url.startswith("unix://"):
        path, _, query = redis_url[len("unix://") :].partition("?")
        db = dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("db", "0")
        return f"redis+socket://{path}?virtual_host={db}"
    return redis_url


def _transport_options(visibility_timeout_s: float | None) -> dict[str, float]:
    if not visibility_timeout_s:
        return {"visibility_timeout": VISIBILITY_TIMEOUT_S}
    # A short timeout (tests, or an ops choice) is only meaningful if idle
    # workers sweep for overdue messages about as often: kombu's default
    # sweep runs every 10 s x 10 calls.
    return {
        "visibility_timeout": visibility_timeout_s,
        "unacked_restore_interval": max(1.0, min(10.0, visibility_timeout_s / 2)),
        "unacked_restore_throttle": 1,
    }


def make_celery(config: ProjectConfig, redis_url: str, *, visibility_timeout_s: float | None = None) -> Celery:
    keys = Keys.of(config)
    app = Celery("potato_queue", broker=kombu_url(redis_url))
    app.conf.update(
        task_default_queue=keys.queue,
        task_acks_late=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options=_transport_options(visibility_timeout_s),
        task_serializer="json",
        accept_content=["json"],
    )
    return app


def schedule_retrain(app: Celery, config: ProjectConfig, every_s: float) -> None:
    """Beat's one entry: an auto-retrain check every every_s, on the project's queue. A tick no executor
    took within every_s expires (a busy single executor would otherwise meet a pile of stale checks)."""
    options = {"queue": Keys.of(config).queue, "expires": every_s}
    app.conf.beat_schedule = {"auto-retrain": {"task": RETRAIN_TASK, "schedule": every_s, "options": options}}
    # Beat's first tick comes one interval after its start; one check now says at once where things stand
    # (the baseline on disk keeps a restart from retraining for the old annotations).
    app.send_task(RETRAIN_TASK, **options)


def enqueue(app: Celery, config: ProjectConfig, run_id: str) -> None:
    """Wake an executor for run_id (it starts the oldest queued run)."""
    app.send_task(EXECUTE_TASK, args=[run_id], queue=Keys.of(config).queue)
