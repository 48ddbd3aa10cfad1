"""`potato-queue training retry RUN_ID CONFIG`: a failed or cancelled run again, resuming from its checkpoint.

A module of its own because cli.py is at its size limit; cli.py hands in its
config argument, its Redis option and how it gets the project's RunService, so
the command checks the config and Redis exactly as the others do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

__all__ = ["retry_command"]

Decorator = Callable[[Any], Any]


def retry_command(config_argument: Decorator, redis_option: Decorator,
                  runs_for: Callable[[Path, str], Any]) -> click.Command:
    """The command, for cli.py's `training` group; `runs_for(config, redis_url)` is the project's RunService."""

    @click.command("retry")
    @click.argument("run_id")
    @config_argument
    @redis_option
    @click.option("--follow", is_flag=True, help="Watch the retry to the end, print the held-out scores; exit 0/1/4.")
    def retry(run_id: str, config: Path, redis_url: str, follow: bool) -> None:
        """Retry a failed or cancelled run: a new run on the same data that resumes from its last checkpoint."""
        from potato_queue import follow as following

        runs = runs_for(config, redis_url)
        record = runs.retry(run_id)
        click.echo(f"queued run {record['run_id']}, the retry of run {run_id} ({record['trainer']} on "
                   f"{record['backend']}): it resumes from run {run_id}'s checkpoint where the machine has one")
        if follow:
            raise click.exceptions.Exit(following.follow(runs.store, record["run_id"]))

    return retry
