"""Trainers: the registry (registry.py, each trainer's name, kinds, modalities and params) and each
trainer's module, with what they share: common.py (seeding, the label space, writing files), hf_fit.py
(a transformers fit's preamble and end: peft with LoRA, the model card, rank-0 saves), hf_heads.py,
hf_text_parts.py, hub.py (the Hugging Face cache, offline), parallel.py (data-parallel ranks), scales.py,
spans.py and the LLM's llm_* modules.

Served to hosts with the bare packages and run in the worker: importing this package is cheap (standard
library only at module level); each trainer imports its heavy packages inside its own functions.
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
