"""Finding a trainer by name and importing what it needs.

This is the authoritative dependency gate: the trainer's module and every
module in ``required_modules(params)`` are really imported here, and an
ImportError becomes exit 3 with ``Trainer '<name>' could not be imported:
<error>`` and the pip extra to install.
"""

import importlib
from typing import Any, Dict, Tuple

from .api import Trainer
from .errors import MissingDependency, UnknownTrainer

__all__ = ["load_trainer"]


def load_trainer(name: str, params: Dict[str, Any]) -> Tuple[Trainer, str]:
    """The trainer instance for *name* and its install hint.

    Raises :class:`UnknownTrainer` (exit 2) or :class:`MissingDependency`
    (exit 3).
    """
    from potato_queue.trainers import registry

    info = registry.trainer_info(name)
    if info is None:
        raise UnknownTrainer("Unknown trainer '%s'. Known trainers: %s" % (name, ", ".join(registry.trainer_names())))
    try:
        trainer = registry.get_trainer(name)
        for module in trainer.required_modules(params):
            importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(
            "Trainer '%s' could not be imported: %s" % (name, exc), install_hint=info.install_hint
        ) from exc
    return trainer, info.install_hint
