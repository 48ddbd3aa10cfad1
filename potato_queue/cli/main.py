"""The command tree: `potato-queue` and its `training` and `potato` groups, each command from its module."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from potato_queue.cli import backends, insight, processes, runs
from potato_queue.cli.options import CONFIG, HELP_SETTINGS, UMASK, Group
from potato_queue.cli.potato import potato

__all__ = ["cli", "training", "main"]


@click.group(cls=Group, context_settings=HELP_SETTINGS)
@click.version_option(package_name="potato-queue")
def cli() -> None:
    """Remote training for Potato annotation projects: local, ssh, SLURM and agent backends."""


@cli.command()
@CONFIG
@click.option("--strict", is_flag=True, help="Fail on any warning that is not acknowledged.")
@click.option("--json", "as_json", is_flag=True, help="Print {errors, warnings, acknowledged} as JSON.")
def validate(config: Path, strict: bool, as_json: bool) -> None:
    """Check a project config (exit 0 valid, 1 errors or strict warnings, 2 unreadable)."""
    from potato_queue.cli.output import print_report
    from potato_queue.lab.events import routing_lines
    from potato_queue.store.potato_compat import ledger_status
    from potato_queue.validate import check_file

    report = check_file(config)
    writeback = ledger_status(report.config) if report.config is not None else None
    if as_json:
        extra = {"potato_writeback": vars(writeback)} if writeback is not None else {}
        webhooks = routing_lines(report.config) if report.config is not None else []
        if webhooks:
            extra["webhooks"] = webhooks
        click.echo(json.dumps({**report.as_json(), **extra}, indent=2))
    else:
        print_report(config, report, strict)
        if writeback is not None:
            click.echo(writeback.line())
        if report.config is not None:
            for line in routing_lines(report.config):
                click.echo(line)
    if not report.ok(strict):
        raise click.exceptions.Exit(1)


@cli.group(cls=Group)
def training() -> None:
    """Runs, backends and agents."""


def _commands(group: click.Group, *commands: Any) -> None:
    for command in commands:
        group.add_command(command)


_commands(cli, processes.serve, processes.executor, processes.worker, processes.beat, processes.up, potato)
_commands(
    training,
    backends.check,
    backends.register,
    backends.agent,
    runs.run,
    runs.runs,
    runs.cancel,
    runs.retry,
    runs.rater,
    runs.rerun,
    runs.logs,
    runs.bundle,
    runs.budget,
    insight.compare,
    insight.next_,
    insight.quality,
)


def main(argv: list[str] | None = None) -> None:
    os.umask(UMASK)
    cli.main(args=argv, prog_name="potato-queue")
