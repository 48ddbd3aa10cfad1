"""Make potato-queue's Potato-side trainer known to Potato, in its server and in its worker child.

Potato 2.12 has no entry points for trainers: its registry (`potato.training.registry`) registers
its built-in ones when it is imported, and every run's worker is a fresh `python -m
potato.training.worker` that imports the registry again. A trainer registered in the server alone
fails in the worker with `unknown_trainer`. So registration rides on the interpreter itself: a
one-line .pth file in the site-packages of Potato's environment (written by `potato-queue potato
install-trainer`).

That line runs at every start of that Python, so it does nothing but put a finder (a class of a few
lines, standard library only) in front of `sys.meta_path`: no import, no file read. Only when a
program imports Potato's registry does the finder look for potato-queue, load this file by its path
(without importing the potato_queue package) and register `potato-queue-remote` by module path, the
way Potato registers its own. With potato-queue uninstalled the finder finds nothing and steps aside.

Standard library only, and nothing here may break an interpreter: every failure is swallowed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["TRAINER_NAME", "PTH_NAME", "PTH_LINE", "registry_spec", "register", "pth_path", "write_pth", "remove_pth"]

TRAINER_NAME = "potato-queue-remote"
REGISTRY = "potato.training.registry"
PTH_NAME = "potato_queue_remote.pth"
# What the finder runs once Potato imports its registry: compiled only then (at start it is a string
# constant, which costs nothing to compile).
_LOADER = """
try:
    from importlib.util import find_spec, spec_from_file_location, module_from_spec
    import os
    package = find_spec('potato_queue')
    where = package and package.submodule_search_locations
    hook = where and os.path.join(list(where)[0], 'potato_hook.py')
    if hook and os.path.isfile(hook):
        found = spec_from_file_location('_potato_queue_hook', hook)
        module = module_from_spec(found)
        found.loader.exec_module(module)
        spec = module.registry_spec(name)
except Exception:
    pass
"""
# What the .pth line runs. Kept free of imports at start (measured in bench/bench_potato_hook.py): the
# finder (one, however often site.py runs the line) answers for Potato's registry once, then removes
# itself (a new list, not the one the import system is walking, so the finder after it is still asked);
# every other import passes it at the cost of a string compare. It loads this file under a private name, so an interpreter that later runs
# potato-queue's code from elsewhere (the code an ssh run copies to a host) finds `potato_queue` unimported.
_FINDER = f"""
class PotatoQueueRemoteHook:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != {REGISTRY!r}:
            return None
        sys.meta_path = [f for f in sys.meta_path if getattr(f, '__name__', '') != cls.__name__]
        scope = {{'name': name}}
        exec({_LOADER!r}, scope)
        return scope.get('spec')
if not [f for f in sys.meta_path if getattr(f, '__name__', '') == PotatoQueueRemoteHook.__name__]:
    sys.meta_path.insert(0, PotatoQueueRemoteHook)
"""
PTH_LINE = f"import sys; exec({_FINDER!r}, {{'sys': sys, '__name__': 'potato_queue_remote_pth'}})\n"


def register(registry: ModuleType) -> None:
    """Register the trainer in Potato's registry module (lazily: nothing of it is imported yet)."""
    try:
        registry.register_lazy(
            TRAINER_NAME,
            "potato_queue.potato_remote",
            "RemoteTrainer",
            hint="pip install 'potato-queue[potato]', then: potato-queue potato install-trainer",
            kinds=("nominal", "multilabel"),
            modalities=("text",),
            description="Trains on a potato-queue backend (a GPU server over ssh, a SLURM cluster, a machine "
            "behind NAT) and brings the predictions back. Params: backend, trainer, params.",
            licence="MIT",
            commercial_use=True,
        )
    except Exception:  # noqa: BLE001 - Potato must start whatever happens here
        pass


class _RegisteringLoader(importlib.abc.Loader):
    """Potato's own loader for its registry, then our registration."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        register(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename ... for tracebacks and inspect
        return getattr(self._inner, name)


def registry_spec(fullname: str) -> importlib.machinery.ModuleSpec | None:
    """Potato's registry's own spec, its loader wrapped to register the trainer once the registry is loaded
    (called by the .pth's finder, which has stepped aside, so this finds the real module)."""
    spec = importlib.util.find_spec(fullname)
    if spec is not None and spec.loader is not None:
        spec.loader = _RegisteringLoader(spec.loader)
    return spec


def pth_path(site_dir: str | None = None) -> Path:
    """Where the .pth goes: the site-packages of the Python that runs this (Potato's, when run from its venv)."""
    return Path(site_dir or sysconfig.get_paths()["purelib"]) / PTH_NAME


def write_pth(site_dir: str | None = None) -> Path:
    path = pth_path(site_dir)
    tmp = path.with_name(f".{PTH_NAME}.{os.getpid()}")
    tmp.write_text(PTH_LINE, encoding="utf-8")
    os.chmod(tmp, 0o644)  # read by every account that runs this Python
    os.replace(tmp, path)
    return path


def remove_pth(site_dir: str | None = None) -> Path | None:
    path = pth_path(site_dir)
    if not path.exists():
        return None
    path.unlink()
    return path
