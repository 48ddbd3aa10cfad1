"""What every command shares: the config argument, the Redis option, how errors print, and the project's
RunService as the server has it (the same rules for a command as for the API)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.settings import DEFAULT_REDIS_URL, REDIS_URL_ENV, Settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from potato_queue.runs.service import RunService
    from potato_queue.store import RunStore

__all__ = [
    "CONFIG",
    "REDIS",
    "run_command",
    "HELP_SETTINGS",
    "UMASK",
    "Group",
    "settings",
    "checked",
    "redis_checked",
    "params_of",
    "runs_for",
    "store_for",
    "store_and_queue",
]

CONFIG = click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
REDIS = click.option(
    "--redis-url",
    envvar=REDIS_URL_ENV,
    default=DEFAULT_REDIS_URL,
    show_default=True,
    help=f"Redis for the queue and live state (env {REDIS_URL_ENV}).",
)


def run_command(name: str | None = None) -> Callable[[Callable[..., Any]], click.Command]:
    """A command on one run: ``RUN_ID CONFIG [--redis-url]``, then the command's own options."""

    def made(function: Callable[..., Any]) -> click.Command:
        return click.command(name)(click.argument("run_id")(CONFIG(REDIS(function))))

    return made


# Wide enough that a command's one-line summary is never cut short in --help.
HELP_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 110, "terminal_width": 110}
# What potato-queue writes (run folders, bundles, logs, predictions, models) holds annotation data:
# readable by this account only, in every process it starts (they inherit the umask).
UMASK = 0o077


class Group(click.Group):
    """Prints a PotatoQueueError (message and fix) and exits with its code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PotatoQueueError as exc:
            click.echo(exc.format(), err=True)
            ctx.exit(exc.exit_code)


def settings() -> Settings:
    """This process's settings: the one read of its environment (every process starts in cli/)."""
    return Settings.from_env(os.environ)


def checked(config: Path, *, say_writeback: bool = False) -> ProjectConfig:
    """The checked project config, carrying this process's settings."""
    from potato_queue.validate import load_checked

    return load_checked(config, say_writeback=say_writeback, settings=settings())


def redis_checked(url: str) -> str:
    from potato_queue.processes.embedded_redis import ping

    if not ping(url, timeout_s=2.0):
        raise PotatoQueueError(
            f"Redis at {url} does not answer",
            fix=f"start Redis there, or pass --redis-url (or set {REDIS_URL_ENV}) to one that runs",
        )
    return url


def params_of(pairs: tuple[str, ...]) -> dict[str, Any]:
    """--param KEY=VALUE pairs: a value that reads as JSON (3, 0.1, true, "x", [1]) is that, else the text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise PotatoQueueError(f"--param {pair!r} is not KEY=VALUE", fix="write it like --param epochs=3")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


def runs_for(config: Path, redis_url: str) -> RunService:
    """The project's RunService for CONFIG and --redis-url, both checked first."""
    from potato_queue.runs.service import RunService

    cfg = checked(config)
    return RunService(cfg, *store_and_queue(cfg, redis_checked(redis_url)))


def store_for(cfg: ProjectConfig, redis_url: str) -> RunStore:
    """The project's store; its Redis client connects at its first call, so a command that reads only the
    run folders needs no Redis."""
    from potato_queue.store import RunStore
    from potato_queue.store.plumbing import client_for

    return RunStore(cfg, client_for(redis_url))


def store_and_queue(cfg: ProjectConfig, redis_url: str) -> tuple[RunStore, Callable[[str], None]]:
    """The project's store, and how a run queued here wakes an executor (Celery's message)."""
    from potato_queue.processes.queue import enqueue, make_celery

    app = make_celery(cfg, redis_url)
    return store_for(cfg, redis_url), lambda run_id: enqueue(app, cfg, run_id)
