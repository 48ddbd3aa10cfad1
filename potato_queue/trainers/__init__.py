"""Trainers: the registry (registry.py) and each trainer's module.

Importing this package is cheap (standard library only); each trainer
imports its heavy packages inside its own functions.
"""

from __future__ import annotations

from potato_queue.trainers.registry import (
    LOCAL_ONLY,
    TRAINERS,
    TrainerInfo,
    get_trainer,
    get_trainer_class,
    install_hint,
    trainer_info,
    trainer_names,
    trainers_for_kind,
    trainers_for_modality,
)

__all__ = [
    "LOCAL_ONLY",
    "TRAINERS",
    "TrainerInfo",
    "get_trainer",
    "get_trainer_class",
    "install_hint",
    "trainer_info",
    "trainer_names",
    "trainers_for_kind",
    "trainers_for_modality",
]
