"""What a deployment sets in the environment: every variable potato-queue reads, read once where a process starts.

`Settings.from_env` is called at a process's edge (cli/, and celery_entry.py for Celery's own tools);
everything below it gets the object it was handed: the server and the executors through the project
config (`config.settings`, set by `validate.load_checked`), the long-running processes as arguments.
Nothing below the edge reads os.environ (a house rule): a knob read deep inside is one a test cannot set
without a process of its own, and one an admin cannot find in a single table.

The variables of Potato's side (potato_remote.py, in Potato's own process) and of the bare packages
(agent/, host/, worker/: their environment is the allow-listed one we start them with) are theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from potato_queue.errors import PotatoQueueError

__all__ = [
    "Settings",
    "DEFAULT_SETTINGS",
    "ENV_NAMES",
    "DEFAULT_REDIS_URL",
    "REDIS_URL_ENV",
    "ADMIN_KEY_ENV",
    "METRICS_TOKEN_ENV",
    "SSH_CONFIG_ENV",
    "WARNINGS_SHOWN_ENV",
    "VISIBILITY_ENV",
    "COPY_STALL_S",
    "FREE_MARGIN_BYTES",
    "HEADER_TIMEOUT_S",
    "BODY_IDLE_S",
]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_URL_ENV = "POTATO_QUEUE_REDIS_URL"
ADMIN_KEY_ENV = "POTATO_ADMIN_API_KEY"
METRICS_TOKEN_ENV = "POTATO_QUEUE_METRICS_TOKEN"
# An ssh config file of the server's own (ssh's -F): for a deployment that keeps its hosts apart from the
# account's ~/.ssh/config, and for the tests' sshd.
SSH_CONFIG_ENV = "POTATO_QUEUE_SSH_CONFIG"
# `up` starts its server and executor with this set to the config's path: it printed the config's warnings
# once, so they do not repeat them.
WARNINGS_SHOWN_ENV = "POTATO_QUEUE_WARNINGS_SHOWN"
# The broker's visibility timeout for an executor: tests shorten it to prove a long run is not executed twice
# when its message is delivered again.
VISIBILITY_ENV = "POTATO_QUEUE_VISIBILITY_TIMEOUT_S"
# ERR-7: a copy of the model files back that sends nothing for this long is ended (executors/remote/copy.py).
COPY_STALL_S = 180.0
# Model files that would leave less than this free on the server's disk are refused (an ssh copy, a ray upload).
FREE_MARGIN_BYTES = 256 << 20
# A request's headers must be whole this long after its first byte, and its body may stay silent this long
# (server/connections.py).
HEADER_TIMEOUT_S = 10.0
BODY_IDLE_S = 60.0


@dataclass(frozen=True)
class Settings:
    """The process's settings, each with its documented default; the timings are shortened by tests only."""

    redis_url: str = DEFAULT_REDIS_URL
    # Used when the config has no admin_api_key (a key kept out of a file Potato also reads).
    admin_api_key: str | None = None
    # A bearer token a Prometheus scraper may use for /metrics instead of the admin key.
    metrics_token: str | None = None
    ssh_config_file: str | None = None
    warnings_shown_for: str | None = None
    copy_stall_s: float = COPY_STALL_S
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_idle_s: float = BODY_IDLE_S
    visibility_timeout_s: float | None = None  # None: the broker's own
    # The environment as the process's edge read it, for the variables a config names by name (a ray backend's
    # token_env): a secret stays out of the config file, and only the edge reads os.environ.
    environment: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """The settings of an environment (os.environ at the edge; a plain dict in a test). Unset and empty
        variables keep the defaults; a timing that is not a number of seconds is refused (exit 2)."""
        values: dict[str, object] = {}
        for name, variable in ENV_NAMES.items():
            raw = env.get(variable) or None
            if raw is not None:
                values[name] = _seconds(variable, raw) if name.endswith("_s") else raw
        return cls(**values, environment=dict(env))  # type: ignore[arg-type]


def _seconds(variable: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise PotatoQueueError(
            f"{variable}={raw!r} is not a number of seconds above 0",
            fix=f"set it to one (e.g. {variable}=30), or unset it for the default",
            exit_code=2,
        )
    return value


# Settings field -> the variable it is read from: the one table of them (docs/operations.md lists it).
ENV_NAMES: dict[str, str] = {
    "redis_url": REDIS_URL_ENV,
    "admin_api_key": ADMIN_KEY_ENV,
    "metrics_token": METRICS_TOKEN_ENV,
    "ssh_config_file": SSH_CONFIG_ENV,
    "warnings_shown_for": WARNINGS_SHOWN_ENV,
    "copy_stall_s": "POTATO_QUEUE_COPY_STALL_S",
    "header_timeout_s": "POTATO_QUEUE_HEADER_TIMEOUT_S",
    "body_idle_s": "POTATO_QUEUE_BODY_IDLE_S",
    "visibility_timeout_s": VISIBILITY_ENV,
}
assert set(ENV_NAMES) == {f.name for f in fields(Settings)} - {"environment"}, "every setting has its variable"

DEFAULT_SETTINGS = Settings()
