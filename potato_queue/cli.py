"""potato-queue: the command line.

Heavy imports (Celery, FastAPI, torch) happen inside the commands that need
them, so `potato-queue validate` starts fast on a small VM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from potato_queue.config import DEFAULT_REDIS_URL, REDIS_URL_ENV, ProjectConfig
from potato_queue.errors import NotBuiltYet, PotatoQueueError

__all__ = ["main", "cli"]

CONFIG = click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
REDIS = click.option(
    "--redis-url",
    envvar=REDIS_URL_ENV,
    default=DEFAULT_REDIS_URL,
    show_default=True,
    help=f"Redis for the queue and live state (env {REDIS_URL_ENV}).",
)


class _Group(click.Group):
    """Prints a PotatoQueueError (message and fix) and exits with its code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PotatoQueueError as exc:
            click.echo(exc.format(), err=True)
            ctx.exit(exc.exit_code)


def _checked(config: Path) -> ProjectConfig:
    from potato_queue.validate import load_checked

    return load_checked(config)


def _not_built(command: str, issue: str) -> NotBuiltYet:
    return NotBuiltYet(
        f"`potato-queue {command}` is not built yet; it arrives with {issue}",
        fix="validate the config meanwhile: potato-queue validate CONFIG --strict",
    )


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="potato-queue")
def cli() -> None:
    """Remote training for Potato annotation projects: local, ssh, SLURM and agent backends."""


@cli.command()
@CONFIG
@click.option("--strict", is_flag=True, help="Fail on any warning that is not acknowledged.")
@click.option("--json", "as_json", is_flag=True, help="Print {errors, warnings, acknowledged} as JSON.")
def validate(config: Path, strict: bool, as_json: bool) -> None:
    """Check a project config (exit 0 valid, 1 errors or strict warnings, 2 unreadable)."""
    from potato_queue.validate import check_file

    report = check_file(config)
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=2))
    else:
        _print_report(config, report, strict)
    if not report.ok(strict):
        raise click.exceptions.Exit(1)


def _print_report(config: Path, report: Any, strict: bool) -> None:
    for text in report.errors:
        click.echo(f"error: {text}")
    for text in report.warnings:
        click.echo(f"warning: {text}")
    for text in report.acknowledged:
        click.echo(f"acknowledged: {text}")
    counts = f"{len(report.errors)} error(s), {len(report.warnings)} warning(s), {len(report.acknowledged)} acknowledged"
    if report.errors:
        click.echo(f"{config}: invalid ({counts})")
    elif strict and report.warnings:
        click.echo(
            f"{config}: fails --strict ({counts}); fix each warning or acknowledge it "
            "under validation.acknowledge"
        )
    else:
        click.echo(f"{config}: valid ({counts})")


@cli.command()
@CONFIG
@REDIS
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--public-url", default=None, help="The URL agents use, when behind a proxy.")
def serve(config: Path, redis_url: str, host: str, port: int, public_url: str | None) -> None:
    """Run the server: Training page, admin JSON API, agent protocol."""
    _checked(config)
    raise _not_built("serve", "the run-lifecycle work (server)")


@cli.command()
@CONFIG
@REDIS
def worker(config: Path, redis_url: str) -> None:
    """Run an executor: a Celery worker that runs one training run at a time."""
    _checked(config)
    raise _not_built("worker", "the run-lifecycle work (executor)")


@cli.command()
@CONFIG
@REDIS
def beat(config: Path, redis_url: str) -> None:
    """Run the auto-retrain schedule (Celery beat)."""
    _checked(config)
    raise _not_built("beat", "the auto-retrain work")


@cli.command()
@CONFIG
@REDIS
def up(config: Path, redis_url: str) -> None:
    """Start everything on this machine: Redis if none answers, server, executor, beat."""
    _checked(config)
    raise _not_built("up", "the embedded-default work")


@cli.group(cls=_Group)
def training() -> None:
    """Runs, backends and agents."""


@training.command()
@click.argument("backend")
@CONFIG
@click.option("--json", "as_json", is_flag=True)
def check(backend: str, config: Path, as_json: bool) -> None:
    """Check that BACKEND could start a run now (exit 0) or not (exit 1)."""
    _checked(config)
    raise _not_built("training check", "each backend's work")


@training.command()
@click.argument("backend")
@CONFIG
@REDIS
def register(backend: str, config: Path, redis_url: str) -> None:
    """Issue a token for an agent BACKEND (printed once; replaces the old one)."""
    _checked(config)
    raise _not_built("training register", "the agent-backend work")


@training.command()
@click.option("--server", required=True, help="The server's URL, as the training machine reaches it.")
@click.option("--backend", required=True)
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--python", "python_exe", default=None, help="The worker's interpreter (default: this one).")
@click.option("--once", is_flag=True)
@click.option("--workdir", default="~/.cache/potato-training", show_default=True)
@click.option("--keep", is_flag=True)
@click.option("--slurm-config", type=click.Path(dir_okay=False, path_type=Path))
def agent(**_: Any) -> None:
    """Run a backend's jobs on this machine until stopped (token from POTATO_TRAINING_TOKEN)."""
    raise _not_built("training agent", "the agent-backend work")


@training.command()
@CONFIG
@REDIS
@click.option("--trainer", required=True)
@click.option("--schema", "schemas", multiple=True, required=True)
@click.option("--backend", default=None)
@click.option("--follow", is_flag=True)
def run(config: Path, **_: Any) -> None:
    """Queue a training run."""
    _checked(config)
    raise _not_built("training run", "the run-lifecycle work")


@training.command()
@CONFIG
@REDIS
def runs(config: Path, redis_url: str) -> None:
    """List the project's runs."""
    _checked(config)
    raise _not_built("training runs", "the run-lifecycle work")


@training.command()
@click.argument("run_id")
@CONFIG
@REDIS
def cancel(run_id: str, config: Path, redis_url: str) -> None:
    """Cancel a queued or running run."""
    _checked(config)
    raise _not_built("training cancel", "the run-lifecycle work")


@training.command()
@click.argument("run_id")
@CONFIG
@click.option("-f", "--follow", is_flag=True)
def logs(run_id: str, config: Path, follow: bool) -> None:
    """Print a run's log."""
    _checked(config)
    raise _not_built("training logs", "the run-lifecycle work")


@training.command()
@CONFIG
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
def bundle(config: Path, out: Path) -> None:
    """Write the bundle a run would get, to inspect it."""
    _checked(config)
    raise _not_built("training bundle", "the run-lifecycle work")


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="potato-queue")


if __name__ == "__main__":
    main()
