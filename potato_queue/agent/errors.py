"""What the agent raises on purpose, under one root (AgentError), as errors.py is the server's and
worker/errors.py the worker's. Standard library only, Python 3.8+ (it runs on the training machine).

The agent turns each into what its run or its admin sees: an ApiError or Unreachable into a retry or a
clear line in its log, a LaunchError into the run's `error` event and exit code 2, a TlsError into the fix
for a CA file; `except AgentError` is the agent's own, `except Exception` is a bug's.
"""

from typing import Optional

__all__ = ["AgentError", "ApiError", "Unreachable", "TlsError", "Retryable", "BundleDownloadError", "LaunchError"]


class AgentError(Exception):
    """The root of the agent's errors."""


class ApiError(AgentError):
    """The server answered with an error status; `detail` is its explanation."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__("HTTP {}: {}".format(status, detail))
        self.status = status
        self.detail = detail


class Unreachable(AgentError):
    """No answer from the server for as long as the caller was willing to wait."""


class TlsError(AgentError):
    """The server's TLS certificate could not be verified: asking again gets the same answer."""


class Retryable(AgentError):
    """One attempt failed in a way another attempt may not (a cut connection, a 503)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class BundleDownloadError(AgentError):
    """The bundle could not be downloaded whole, or is not the one the job names."""


class LaunchError(AgentError):
    """The worker could not be started; the run ends with exit code 2 and this error.

    `error_code` is the `error` event's code (like `python_not_found`),
    `install_hint` the fix shown to the admin.
    """

    def __init__(self, error_code: str, message: str, install_hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.install_hint = install_hint
