"""Exit codes, error codes and the exceptions that carry them.

Every way a run can end maps to one exit code (defined in exit_codes.py) and
one ``error`` event code, and this module is the only place that mapping lives. :func:`classify`
turns any exception (including ones raised by torch or scikit-learn, which
the worker never imports at module level) into that triple.
"""

from typing import Tuple

from potato_queue.wire.exit_codes import (
    EXIT_BAD_SPEC,
    EXIT_CANCELLED,
    EXIT_MISSING_DEPENDENCY,
    EXIT_OOM,
    EXIT_PREEMPTED,
    EXIT_UNEXPECTED,
)

__all__ = [
    "NVRTC_HINT",
    "WorkerError",
    "RefusedBeforeWork",
    "SpecError",
    "BundleError",
    "UnknownTrainer",
    "ValidationFailed",
    "MissingDependency",
    "Cancelled",
    "Preempted",
    "TrainerError",
    "OutOfMemory",
    "Failure",
    "classify",
    "is_out_of_memory",
    "hint_for",
]


#: ERR-11: torch loads the NVRTC builtins library of the CUDA version it was
#: built for; a different nvidia-cuda-nvrtc wheel leaves it missing.
NVRTC_HINT = (
    "torch's CUDA version and the installed nvidia-cuda-nvrtc package's CUDA "
    "version differ, so torch cannot find libnvrtc-builtins. Install the "
    "nvidia-cuda-nvrtc wheel that matches torch.version.cuda (or reinstall "
    "torch from the index for that CUDA version) in the worker's environment."
)

OOM_ADVICE = "Try a smaller batch_size or max_length, a smaller model, or fewer items."


class WorkerError(Exception):
    """An anticipated failure, with its exit code and ``error`` event code."""

    exit_code = EXIT_UNEXPECTED
    code = "fit_failed"

    def __init__(self, message: str, install_hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.install_hint = install_hint


class RefusedBeforeWork(WorkerError):
    """What the run was given cannot be run: refused before any work started (exit 2)."""

    exit_code = EXIT_BAD_SPEC


class SpecError(RefusedBeforeWork):
    """spec.json is missing, unreadable or malformed."""

    code = "bad_spec"


class BundleError(RefusedBeforeWork):
    """The bundle directory does not hold a readable bundle v1."""

    code = "bad_bundle"


class UnknownTrainer(RefusedBeforeWork):
    """The spec names a trainer the registry does not know."""

    code = "unknown_trainer"


class ValidationFailed(RefusedBeforeWork):
    """The trainer refused the spec/bundle before any work started."""

    code = "validation_failed"


class MissingDependency(WorkerError):
    """A package the trainer needs is not importable here."""

    exit_code = EXIT_MISSING_DEPENDENCY
    code = "missing_dependency"


class Cancelled(WorkerError):
    """The run was asked to stop (SIGTERM/SIGINT) and did."""

    exit_code = EXIT_CANCELLED
    code = "cancelled"


class Preempted(Cancelled):
    """The machine was taken back (SIGUSR1: SLURM's --signal ahead of a preemption or a time limit)."""

    exit_code = EXIT_PREEMPTED
    code = "preempted"


class TrainerError(WorkerError):
    """The trainer could not do what was asked."""


class OutOfMemory(WorkerError):
    """RAM or accelerator memory ran out (or max_ram_mb was exceeded)."""

    exit_code = EXIT_OOM
    code = "out_of_memory"


class Failure:
    """How a run ended badly: exit code, error code, message, hint."""

    __slots__ = ("exit_code", "code", "message", "install_hint")

    def __init__(self, exit_code: int, code: str, message: str, install_hint: str = "") -> None:
        self.exit_code = exit_code
        self.code = code
        self.message = message
        self.install_hint = install_hint

    def as_tuple(self) -> Tuple[int, str, str, str]:
        """``(exit_code, code, message, install_hint)``."""
        return (self.exit_code, self.code, self.message, self.install_hint)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether *exc* is a host or accelerator out-of-memory, without importing torch."""
    if isinstance(exc, (MemoryError, OutOfMemory)):
        return True
    name = type(exc).__name__
    if name in ("OutOfMemoryError", "CudaOutOfMemoryError"):
        return True
    text = str(exc).lower()
    return "out of memory" in text and ("cuda" in text or "mps" in text or "hip" in text)


def hint_for(text: str) -> str:
    """A known remedy for an error text, or ``""``."""
    if "libnvrtc-builtins" in text:
        return NVRTC_HINT
    return ""


def classify(exc: BaseException, trainer_name: str = "", install_hint: str = "") -> Failure:
    """Map any exception raised during a run to a :class:`Failure`.

    *install_hint* is the trainer's pip hint, used when a lazy import inside
    the trainer fails mid-run.
    """
    if isinstance(exc, WorkerError):
        hint = exc.install_hint or hint_for(exc.message)
        return Failure(exc.exit_code, exc.code, exc.message, hint)
    if is_out_of_memory(exc):
        detail = str(exc) or type(exc).__name__
        return Failure(EXIT_OOM, "out_of_memory", "Out of memory: %s. %s" % (detail, OOM_ADVICE))
    if isinstance(exc, ImportError):
        message = "Trainer '%s' could not be imported: %s" % (trainer_name, exc)
        return Failure(EXIT_MISSING_DEPENDENCY, "missing_dependency", message, install_hint)
    message = "%s: %s" % (type(exc).__name__, exc)
    return Failure(EXIT_UNEXPECTED, "fit_failed", message, hint_for(message))
