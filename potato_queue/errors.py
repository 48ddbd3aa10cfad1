"""One root for every error potato-queue raises on purpose.

Each error carries the message a user reads, the fix they need, and the exit
code the CLI ends with (click's habit), so an entry point only has to print it.
"""

from __future__ import annotations

__all__ = [
    "PotatoQueueError",
    "ConfigError",
    "ConfigUnreadable",
    "NotFound",
    "Conflict",
    "Invalid",
    "Denied",
    "Forbidden",
    "TooLarge",
]


class PotatoQueueError(Exception):
    """Base class: `message` says what is wrong, `fix` what to do about it."""

    exit_code: int = 1

    def __init__(self, message: str, *, fix: str | None = None, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        if exit_code is not None:
            self.exit_code = exit_code

    def format(self) -> str:
        text = f"error: {self.message}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class ConfigError(PotatoQueueError):
    """The project config has errors; `errors` lists each one."""

    def __init__(self, path: str, errors: list[str]) -> None:
        noun = "error" if len(errors) == 1 else "errors"
        super().__init__(
            f"{path} has {len(errors)} {noun}",
            fix=f"correct them, then check with: potato-queue validate {path} --strict",
        )
        self.path = path
        self.errors = errors

    def format(self) -> str:
        lines = [f"error: {e}" for e in self.errors]
        lines.append(f"{self.message}; {self.fix}")
        return "\n".join(lines)


class ConfigUnreadable(PotatoQueueError):
    """The file is missing, unreadable, or not YAML (exit 2, like a usage error)."""

    exit_code = 2


# What a request to the runs asked for cannot be done. The core raises these; each edge says them its own
# way, once: the HTTP API by the status its exception handler maps each to (server/guard.py), the CLI by the
# message, the fix and exit_code.


class NotFound(PotatoQueueError):
    """The project has no such thing: a run, a backend (HTTP 404)."""


class Conflict(PotatoQueueError):
    """Not in the state things are in: a finished run, training switched off, an unconfigured backend (409)."""


class Invalid(PotatoQueueError):
    """The request itself is wrong: an unknown trainer or schema, params too large (400)."""


class Denied(PotatoQueueError):
    """The credentials do not open this: a token that is not, or no longer, the backend's (401)."""


class Forbidden(PotatoQueueError):
    """Known credentials, but not for this: another backend's token, a cross-site form (403)."""


class TooLarge(PotatoQueueError):
    """A body over its limit: predictions over max_predictions_mb (413)."""
