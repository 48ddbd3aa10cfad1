"""The long-running processes: `serve`, `executor` (`worker`, its former name, kept), `beat`, and `up`, which
starts them all on one machine."""

from __future__ import annotations

import os
from pathlib import Path

import click

from potato_queue.cli.options import CONFIG, REDIS, checked, params_of, redis_checked
from potato_queue.errors import PotatoQueueError

__all__ = ["serve", "executor", "worker", "beat", "up"]


@click.command()
@CONFIG
@REDIS
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--public-url", default=None, help="The URL agents use, when behind a proxy.")
@click.option(
    "--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Serve https with this certificate (PEM)."
)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="The certificate's private key (PEM).")
def serve(
    config: Path,
    redis_url: str,
    host: str,
    port: int,
    public_url: str | None,
    tls_cert: str | None,
    tls_key: str | None,
) -> None:
    """Run the server: Training page, admin JSON API, agent protocol."""
    from potato_queue.processes.server import serve_forever

    if bool(tls_cert) != bool(tls_key):
        raise PotatoQueueError("--tls-cert and --tls-key go together", fix="give both, or neither for http")
    cfg = checked(config, say_writeback=True)
    serve_forever(
        cfg,
        redis_checked(redis_url),
        host=host,
        port=port,
        public_url=public_url,
        tls=(tls_cert, tls_key) if tls_cert and tls_key else None,
        header_timeout_s=cfg.settings.header_timeout_s,
        body_idle_s=cfg.settings.body_idle_s,
    )


@click.command()
@CONFIG
@REDIS
@click.option("-v", "--verbose", is_flag=True, help="Celery's banner and its info log too.")
@click.option("-q", "--quiet", is_flag=True, help="Only errors: not even a line per run.")
def executor(config: Path, redis_url: str, verbose: bool, quiet: bool) -> None:
    """Run an executor: a Celery worker that runs one training run at a time."""
    from potato_queue.processes.executor import run_executor

    cfg = checked(config, say_writeback=True)
    run_executor(
        cfg,
        redis_checked(redis_url),
        verbosity=2 if verbose else 0 if quiet else 1,
        visibility_timeout_s=cfg.settings.visibility_timeout_s,
    )


# The command's name before 0.2 (it starts what the code and the docs call an executor): kept, so that
# Procfiles and service units written for it go on working.
worker = click.Command(
    "worker",
    params=executor.params,
    callback=executor.callback,
    help="The same as `executor` (its former name, kept for the scripts that use it).",
    short_help="The same as `executor` (its former name).",
)


@click.command()
@CONFIG
@REDIS
@click.option(
    "--every-s",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="How often to check for new annotations (seconds).",
)
@click.option("-v", "--verbose", is_flag=True, help="Celery beat's banner and its info log too.")
def beat(config: Path, redis_url: str, every_s: float, verbose: bool) -> None:
    """Run the auto-retrain schedule (Celery beat): one per project; the executors run its checks."""
    from potato_queue.processes.beat import run_beat

    run_beat(checked(config), redis_checked(redis_url), every_s=every_s, verbose=verbose)


@click.command()
@CONFIG
@REDIS
@click.option(
    "--run",
    "trainers",
    multiple=True,
    help="Queue a run with this trainer, follow it, then stop; repeated, the runs go in order and their "
    "held-out scores are compared.",
)
@click.option(
    "--schema",
    "schemas",
    multiple=True,
    help="Schema(s) for --run (default: each trainer's: the schemes of the kinds it trains).",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="A param for the --run trainers that have it (epochs=8 goes to hf-text-classification only).",
)
@click.option("--port", default=8000, show_default=True, type=int, help="The server's port (0: any free one).")
@click.option("-v", "--verbose", is_flag=True, help="The executor's own log too (Celery's banner, a line per run).")
def up(
    config: Path,
    redis_url: str,
    trainers: tuple[str, ...],
    schemas: tuple[str, ...],
    params: tuple[str, ...],
    port: int,
    verbose: bool,
) -> None:
    """Start everything on this machine: Redis if none answers, the server, an executor, beat."""
    from potato_queue.processes.up import params_by_trainer, planned_runs
    from potato_queue.processes.up import up as start_all

    cfg = checked(config, say_writeback=True)
    planned = planned_runs(cfg, params_by_trainer(list(trainers), params_of(params)), list(schemas))
    raise click.exceptions.Exit(
        start_all(cfg, redis_url, environ=os.environ, trainers=planned, port=port, verbose=verbose)
    )
