"""Celery's own tools on potato-queue's app: `celery -A potato_queue.celery_entry inspect ping`, Flower.

The app is the executors' (the same queue, broker and settings), built from the
project config in $POTATO_CONFIG and the Redis in $POTATO_QUEUE_REDIS_URL (or
the default). Only these tools import this module; potato-queue's own commands
build their app from the config they are given.
"""

from __future__ import annotations

import os

from potato_queue.processes.queue import make_celery
from potato_queue.settings import Settings
from potato_queue.validate import load_checked

__all__ = ["app"]

if "POTATO_CONFIG" not in os.environ:
    raise SystemExit(
        "potato_queue.celery_entry: set POTATO_CONFIG to the project's config.yaml (the app's queue is the project's)"
    )
_settings = Settings.from_env(os.environ)
app = make_celery(load_checked(os.environ["POTATO_CONFIG"], settings=_settings), _settings.redis_url)
