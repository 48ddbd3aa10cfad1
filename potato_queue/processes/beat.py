"""Beat: Celery beat sending the auto-retrain check on the project's queue; the executors run it."""

from __future__ import annotations

from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.potato_hook import TRAINER_NAME

__all__ = ["run_beat", "RETRAIN_EVERY_S"]

RETRAIN_EVERY_S = 60.0


def run_beat(config: ProjectConfig, redis_url: str, *, every_s: float = RETRAIN_EVERY_S, verbose: bool = False) -> None:
    """Celery beat sending the auto-retrain check every every_s; the executors run it. Its schedule is
    kept in memory (celery.beat:Scheduler): the default one writes celerybeat-schedule into the working
    directory, and a fixed interval has nothing worth keeping."""
    from potato_queue.processes.queue import make_celery, schedule_retrain

    settings = config.model_training.auto_retrain
    if not settings.enabled or not settings.trainer:
        raise PotatoQueueError(
            f"auto-retrain is off in {config.config_path}: beat has nothing to schedule",
            fix="set model_training.auto_retrain.enabled: true and its trainer, or do not run beat",
            exit_code=2,
        )
    if settings.trainer == TRAINER_NAME:
        raise PotatoQueueError(
            f"auto-retrain of this project is Potato's: model_training.auto_retrain.trainer is {TRAINER_NAME} in "
            f"{config.config_path}, so Potato's own server starts each run (queued here through that trainer), and a "
            "beat would start every run twice",
            fix="do not run beat for this project (up does not start it), or name one of potato-queue's trainers "
            "there to let beat schedule instead",
            exit_code=2,
        )
    app = make_celery(config, redis_url)
    schedule_retrain(app, config, every_s)
    print(
        f"potato-queue beat: an auto-retrain check every {every_s:g} s (trainer {settings.trainer}, "
        f"after {settings.update_frequency} new annotations, at most every {settings.min_interval_s:g} s)",
        flush=True,
    )
    app.Beat(scheduler="celery.beat:Scheduler", loglevel="INFO" if verbose else "WARNING", quiet=not verbose).run()
