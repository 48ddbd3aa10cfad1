"""Make potato-queue's Potato-side trainer known to Potato, in its server and in its worker child.

Potato 2.12 has no entry points for trainers: its registry (`potato.training.registry`) registers
its built-in ones when it is imported, and every run's worker is a fresh `python -m
potato.training.worker` that imports the registry again. A trainer registered in the server alone
fails in the worker with `unknown_trainer`. So registration rides on the interpreter itself: a
one-line .pth file in the site-packages of Potato's environment (written by `potato-queue potato
install-trainer`) loads this file at every start (by its path, without importing the potato_queue
package), which waits at no cost for the registry's import and then registers `potato-queue-remote`
by module path, the way Potato registers its own.

Standard library only, and nothing here may break an interpreter: every failure is swallowed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["TRAINER_NAME", "PTH_NAME", "PTH_LINE", "install", "register", "pth_path", "write_pth", "remove_pth"]

TRAINER_NAME = "potato-queue-remote"
REGISTRY = "potato.training.registry"
PTH_NAME = "potato_queue_remote.pth"
# Loads this file by its path under a private name, without importing the potato_queue package: an
# interpreter that later runs potato-queue's code from elsewhere (the code an ssh run copies to a host)
# must find `potato_queue` unimported. With potato-queue uninstalled the line does nothing.
PTH_LINE = ("import importlib.util as _u, os as _o; _s = _u.find_spec('potato_queue'); "
            "_p = _s is not None and _s.submodule_search_locations and "
            "_o.path.join(list(_s.submodule_search_locations)[0], 'potato_hook.py'); "
            "_h = _p and _o.path.isfile(_p) and _u.spec_from_file_location('_potato_queue_hook', _p); "
            "_m = _h and _u.module_from_spec(_h); _m and (_h.loader.exec_module(_m) or _m.install())\n")


def register(registry: ModuleType) -> None:
    """Register the trainer in Potato's registry module (lazily: nothing of it is imported yet)."""
    try:
        registry.register_lazy(
            TRAINER_NAME, "potato_queue.potato_remote", "RemoteTrainer",
            hint="pip install 'potato-queue[potato]', then: potato-queue potato install-trainer",
            kinds=("nominal", "multilabel"), modalities=("text",),
            description="Trains on a potato-queue backend (a GPU server over ssh, a SLURM cluster, a machine "
                        "behind NAT) and brings the predictions back. Params: backend, trainer, params.",
            licence="MIT", commercial_use=True)
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


class _RegistryFinder(importlib.abc.MetaPathFinder):
    """Answers for one module, once; every other import passes by at the cost of a string compare."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != REGISTRY:
            return None
        _remove_finder()
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


def _remove_finder() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RegistryFinder)]


def install() -> None:
    """Register now if Potato's registry is loaded, else when it is."""
    loaded = sys.modules.get(REGISTRY)
    if loaded is not None:
        register(loaded)
    elif not any(isinstance(f, _RegistryFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegistryFinder())


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
