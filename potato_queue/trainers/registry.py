"""Trainer registry: name -> where the class lives, what it needs, how to install it.

Listing trainers imports nothing heavy (and nothing outside the standard
library): the class is imported only by :func:`get_trainer`, inside the
worker, and the worker imports the trainer's packages right after, so a
missing one is exit 3 with ``install_hint``.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from potato_queue.worker.api import Trainer

__all__ = [
    "TrainerInfo",
    "TRAINERS",
    "EVERY_MODALITY",
    "LOCAL_ONLY",
    "trainer_names",
    "trainer_info",
    "trainers_for_kind",
    "trainers_for_modality",
    "get_trainer_class",
    "get_trainer",
    "install_hint",
]


#: Every modality a bundle can have (Potato's rule, bundle/write.py): what a trainer that never reads an item takes.
EVERY_MODALITY = ("text", "image", "audio", "video", "point_cloud")

# pip's name for an import name, where they differ.
PIP_NAMES = {"sklearn": "scikit-learn", "PIL": "pillow"}


def potato_queue_installed() -> bool:
    """Whether potato-queue is pip-installed for this Python; not, where its code came as the zipapp (a
    training host reached by ssh, slurm or a served agent.pyz), and then its extras mean nothing there."""
    try:
        from importlib import metadata

        metadata.distribution("potato-queue")
    except Exception:  # PackageNotFoundError; metadata itself missing on an odd build
        return False
    return True


def install_hint(extra: str, packages: tuple[str, ...] = ()) -> str:
    """How to install what a trainer needs on this machine: potato-queue's *extra* where potato-queue is
    installed, else the *packages* themselves into this Python (an ssh backend can list them instead)."""
    if potato_queue_installed() or not packages:
        return f"pip install 'potato-queue[{extra}]'"
    names = " ".join(PIP_NAMES.get(name, name) for name in packages)
    return (
        f"install the trainer's packages into the Python that ran it on this host: {sys.executable} -m pip "
        f"install {names} (or, on an ssh backend, list them under packages:)"
    )


@dataclass(frozen=True)
class TrainerInfo:
    """What the server and the UI know about a trainer without importing it."""

    name: str
    #: ``"package.module:ClassName"``
    target: str
    description: str
    #: The pip extra holding the trainer's packages (``""``: none needed).
    extra: str = ""
    kinds: tuple[str, ...] = ("nominal",)
    #: What its items must be (a bundle's modality: text, image, ...).
    modalities: tuple[str, ...] = ("text",)
    local_only: bool = False
    #: The params a run may set and their defaults (the trainer reads its defaults from here; the page shows them).
    params: tuple[tuple[str, object], ...] = ()
    #: Import names of the packages the trainer needs (what `extra` installs).
    packages: tuple[str, ...] = ()

    def default(self, name: str) -> object:
        """The default of param *name*."""
        return dict(self.params)[name]

    @property
    def install_hint(self) -> str:
        """``pip install 'potato-queue[<extra>]'``, or ``""``."""
        return install_hint(self.extra, self.packages) if self.extra else ""

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready description."""
        return {
            "name": self.name,
            "description": self.description,
            "extra": self.extra,
            "install_hint": self.install_hint,
            "kinds": list(self.kinds),
            "modalities": list(self.modalities),
            "local_only": self.local_only,
            "params": dict(self.params),
            "packages": list(self.packages),
        }


# hf-text- and hf-token-classification: the same fine-tune of the same default encoder (the params they declare).
_FINE_TUNE_TEXT_PARAMS: tuple[tuple[str, object], ...] = (
    ("model_name", "sentence-transformers/all-MiniLM-L6-v2"),
    ("epochs", 3),
    ("learning_rate", 5e-5),
    ("batch_size", 16),
    ("max_length", 256),
    ("lora", None),
)

TRAINERS: dict[str, TrainerInfo] = {
    info.name: info
    for info in (
        TrainerInfo(
            name="hf-text-classification",
            target="potato_queue.trainers.hf_text:HFTextClassificationTrainer",
            description="Fine-tunes a transformers sequence classifier (one sigmoid a label for a multiselect, one "
            "per step of a likert, a regression for a slider; optionally LoRA via peft).",
            extra="train-text",
            kinds=("nominal", "multilabel", "ordinal", "continuous"),
            params=_FINE_TUNE_TEXT_PARAMS,
            packages=("torch", "transformers"),
        ),
        TrainerInfo(
            name="hf-token-classification",
            target="potato_queue.trainers.hf_tokens:HFTokenClassificationTrainer",
            description="Fine-tunes a transformers token classifier on a span scheme (BIO tags from Potato's "
            "character offsets, spans back; optionally LoRA via peft).",
            extra="train-text",
            kinds=("span",),
            params=_FINE_TUNE_TEXT_PARAMS,
            packages=("torch", "transformers"),
        ),
        TrainerInfo(
            name="hf-image-classification",
            target="potato_queue.trainers.hf_image:HFImageClassificationTrainer",
            description="Fine-tunes a transformers image classifier (ViT, ConvNeXt, ...) on the items' images "
            "(one sigmoid a label for a multiselect; optionally LoRA via peft).",
            extra="train-image",
            kinds=("nominal", "multilabel"),
            modalities=("image",),
            params=(
                ("model_name", "google/vit-base-patch16-224-in21k"),
                ("epochs", 3),
                ("learning_rate", 5e-5),
                ("batch_size", 16),
                ("lora", None),
            ),
            packages=("torch", "transformers", "PIL"),
        ),
        TrainerInfo(
            name="hf-llm-lora",
            target="potato_queue.trainers.hf_llm:HFLLMLoRATrainer",
            description="Fine-tunes a decoder LLM (Llama, Qwen, Mistral, Phi) as a classifier with LoRA (one sigmoid "
            "a label for a multiselect); 4-bit base weights on a CUDA GPU; checkpoints and resumes.",
            extra="train-llm",
            kinds=("nominal", "multilabel"),
            params=(
                ("model_name", "Qwen/Qwen2.5-0.5B"),
                ("epochs", 1),
                ("learning_rate", 2e-4),
                ("batch_size", 4),
                ("grad_accum_steps", 4),
                ("max_length", 256),
                ("lora", None),
                ("load_in_4bit", "auto"),
                ("precision", "auto"),
                ("gradient_checkpointing", True),
                ("merge", False),
                ("checkpoint_every_steps", 50),
            ),
            packages=("torch", "transformers", "peft"),
        ),
        TrainerInfo(
            name="sklearn-text",
            target="potato_queue.trainers.sklearn_text:SklearnTextTrainer",
            description="TF-IDF features and logistic regression (one per label for a multiselect, one per step of "
            "a likert; a ridge regression for a slider); fast, CPU only.",
            extra="train-sklearn",
            kinds=("nominal", "multilabel", "ordinal", "continuous"),
            params=(("C", 1.0), ("max_features", 50000), ("ngram_max", 2), ("max_iter", 1000)),
            packages=("sklearn",),
        ),
        TrainerInfo(
            name="majority-baseline",
            target="potato_queue.trainers.majority:MajorityBaselineTrainer",
            description="Predicts each schema's most frequent training label: the floor to beat, and a fast end-to-end check.",
            # hold_s: a run that lasts that long and costs nothing, to try cancel, heartbeats and limits on a backend.
            params=(("hold_s", 0),),
            modalities=EVERY_MODALITY,  # it never reads the items
        ),
        TrainerInfo(
            name="decision-calibrate",
            target="potato_queue.trainers.decision_calibrate:DecisionCalibrateTrainer",
            description="No retraining: temperature-scales the latest run's confidences on the val split.",
            local_only=True,
            modalities=EVERY_MODALITY,
        ),
    )
}

#: Trainers that run only on the annotation server (they read its run store).
LOCAL_ONLY = frozenset(name for name, info in TRAINERS.items() if info.local_only)


def trainer_names() -> list[str]:
    """Every registered trainer name, sorted."""
    return sorted(TRAINERS)


def trainer_info(name: str) -> TrainerInfo | None:
    """The registry entry for *name*, or None."""
    return TRAINERS.get(name)


def trainers_for_kind(kind: str) -> list[str]:
    """The trainers that declare schema kind *kind*, sorted."""
    return [name for name in trainer_names() if kind in TRAINERS[name].kinds]


def trainers_for_modality(kind: str, modality: str) -> list[str]:
    """The trainers that train schema kind *kind* on items of *modality*, sorted (what a refusal suggests: not
    decision-calibrate, local only, which recalibrates a run rather than trains one)."""
    return [
        name
        for name in trainers_for_kind(kind)
        if modality in TRAINERS[name].modalities and not TRAINERS[name].local_only
    ]


def get_trainer_class(name: str) -> type[Trainer]:
    """Import and return the class of trainer *name* (KeyError when unknown)."""
    info = TRAINERS.get(name)
    if info is None:
        raise KeyError(f"Unknown trainer '{name}'. Known trainers: {', '.join(trainer_names())}")
    module_name, _, class_name = info.target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def get_trainer(name: str) -> Trainer:
    """A new instance of trainer *name*."""
    return get_trainer_class(name)()
