"""A project's annotation schemes as potato-queue reads them: every Potato annotation type, its kind by
Potato's rule, what its answer stores, whether a run trains it (annotation_types.py). Imports nothing of
ours, so the config (which lists a multirate's rows as schemes of their own) can read it."""

from potato_queue.schemes import annotation_types
from potato_queue.schemes.annotation_types import *  # noqa: F403 - this package is that module's front door

__all__ = annotation_types.__all__
