"""potato-queue: the command line.

Heavy imports (Celery, FastAPI, torch) happen inside the commands that need
them, so `potato-queue validate` starts fast on a small VM.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from potato_queue.config import DEFAULT_REDIS_URL, REDIS_URL_ENV, ProjectConfig
from potato_queue.errors import NotBuiltYet, PotatoQueueError

__all__ = ["main", "cli"]

CONFIG = click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
REDIS = click.option("--redis-url", envvar=REDIS_URL_ENV, default=DEFAULT_REDIS_URL, show_default=True,
                     help=f"Redis for the queue and live state (env {REDIS_URL_ENV}).")


class _Group(click.Group):
    """Prints a PotatoQueueError (message and fix) and exits with its code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PotatoQueueError as exc:
            click.echo(exc.format(), err=True)
            ctx.exit(exc.exit_code)


def _checked(config: Path, *, say_writeback: bool = False) -> ProjectConfig:
    from potato_queue.validate import load_checked

    return load_checked(config, say_writeback=say_writeback)


def _redis_checked(url: str) -> str:
    from potato_queue.embedded_redis import ping

    if not ping(url, timeout_s=2.0):
        raise PotatoQueueError(f"Redis at {url} does not answer",
                               fix=f"start Redis there, or pass --redis-url (or set {REDIS_URL_ENV}) to one that runs")
    return url


def _not_built(command: str, issue: str) -> NotBuiltYet:
    return NotBuiltYet(
        f"`potato-queue {command}` is not built yet; it arrives with {issue}",
        fix="validate the config meanwhile: potato-queue validate CONFIG --strict",
    )


# The broker's visibility timeout for `worker` (see there).
VISIBILITY_ENV = "POTATO_QUEUE_VISIBILITY_TIMEOUT_S"
# Wide enough that a command's one-line summary is never cut short in --help.
HELP_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 110, "terminal_width": 110}


@click.group(cls=_Group, context_settings=HELP_SETTINGS)
@click.version_option(package_name="potato-queue")
def cli() -> None:
    """Remote training for Potato annotation projects: local, ssh, SLURM and agent backends."""


@cli.command()
@CONFIG
@click.option("--strict", is_flag=True, help="Fail on any warning that is not acknowledged.")
@click.option("--json", "as_json", is_flag=True, help="Print {errors, warnings, acknowledged} as JSON.")
def validate(config: Path, strict: bool, as_json: bool) -> None:
    """Check a project config (exit 0 valid, 1 errors or strict warnings, 2 unreadable)."""
    from potato_queue.store.potato_ledger import ledger_status
    from potato_queue.validate import check_file

    report = check_file(config)
    writeback = ledger_status(report.config) if report.config is not None else None
    if as_json:
        extra = {"potato_writeback": vars(writeback)} if writeback is not None else {}
        click.echo(json.dumps({**report.as_json(), **extra}, indent=2))
    else:
        _print_report(config, report, strict)
        if writeback is not None:
            click.echo(writeback.line())
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
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Serve https with this certificate (PEM).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="The certificate's private key (PEM).")
def serve(config: Path, redis_url: str, host: str, port: int, public_url: str | None, tls_cert: str | None,
          tls_key: str | None) -> None:
    """Run the server: Training page, admin JSON API, agent protocol."""
    from potato_queue.processes.server import serve_forever
    from potato_queue.server.connections import BODY_IDLE_S, HEADER_TIMEOUT_S

    if bool(tls_cert) != bool(tls_key):
        raise PotatoQueueError("--tls-cert and --tls-key go together", fix="give both, or neither for http")
    serve_forever(_checked(config, say_writeback=True), _redis_checked(redis_url), host=host, port=port, public_url=public_url,
                  tls=(tls_cert, tls_key) if tls_cert and tls_key else None,
                  # HEADER_TIMEOUT_S's 10 s and BODY_IDLE_S's 60 s; shorter for testing only
                  header_timeout_s=float(os.environ.get("POTATO_QUEUE_HEADER_TIMEOUT_S") or HEADER_TIMEOUT_S),
                  body_idle_s=float(os.environ.get("POTATO_QUEUE_BODY_IDLE_S") or BODY_IDLE_S))


@cli.command()
@CONFIG
@REDIS
@click.option("-v", "--verbose", is_flag=True, help="Celery's banner and its info log too.")
@click.option("-q", "--quiet", is_flag=True, help="Only errors: not even a line per run.")
def worker(config: Path, redis_url: str, verbose: bool, quiet: bool) -> None:
    """Run an executor: a Celery worker that runs one training run at a time."""
    from potato_queue.processes.executor import run_executor

    # Read here, at the process's edge: tests shorten the broker's visibility timeout to prove a long run is
    # not executed twice when its message is delivered again.
    timeout = os.environ.get(VISIBILITY_ENV)
    run_executor(_checked(config, say_writeback=True), _redis_checked(redis_url),
                 verbosity=2 if verbose else 0 if quiet else 1, visibility_timeout_s=float(timeout) if timeout else None)


@cli.command()
@CONFIG
@REDIS
@click.option("--every-s", default=60.0, show_default=True, type=click.FloatRange(min=0.1),
              help="How often to check for new annotations (seconds).")
@click.option("-v", "--verbose", is_flag=True, help="Celery beat's banner and its info log too.")
def beat(config: Path, redis_url: str, every_s: float, verbose: bool) -> None:
    """Run the auto-retrain schedule (Celery beat): one per project; the executors run its checks."""
    from potato_queue.processes.beat import run_beat

    run_beat(_checked(config), _redis_checked(redis_url), every_s=every_s, verbose=verbose)


@cli.command()
@CONFIG
@REDIS
@click.option("--run", "trainers", multiple=True,
              help="Queue a run with this trainer, follow it, then stop; repeated, the runs go in order and their "
                   "held-out scores are compared.")
@click.option("--schema", "schemas", multiple=True, help="Schema(s) for --run (default: each trainer's: the schemes of the kinds it trains).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A param for the --run trainers that have it (epochs=8 goes to hf-text-classification only).")
@click.option("--port", default=8000, show_default=True, type=int, help="The server's port (0: any free one).")
@click.option("-v", "--verbose", is_flag=True, help="The executor's own log too (Celery's banner, a line per run).")
def up(config: Path, redis_url: str, trainers: tuple[str, ...], schemas: tuple[str, ...], params: tuple[str, ...],
       port: int, verbose: bool) -> None:
    """Start everything on this machine: Redis if none answers, the server, an executor, beat."""
    from potato_queue.processes.up import params_by_trainer
    from potato_queue.processes.up import up as start_all

    cfg = _checked(config, say_writeback=True)
    by_trainer = params_by_trainer(list(trainers), _params(params))
    raise click.exceptions.Exit(start_all(cfg, redis_url, trainers=by_trainer, schemas=list(schemas),
                                          port=port, verbose=verbose))


@cli.group(cls=_Group)
def training() -> None:
    """Runs, backends and agents."""


@training.command()
@click.argument("backend")
@CONFIG
@REDIS
@click.option("--json", "as_json", is_flag=True)
@click.option("--llm", metavar="MODEL", help="Also whether hf-llm-lora can fine-tune MODEL there (GPU memory, bitsandbytes).")
@click.option("--load-in-4bit", type=click.Choice(["auto", "true", "false"]), default="auto", show_default=True)
def check(backend: str, config: Path, redis_url: str, as_json: bool, llm: str | None, load_in_4bit: str) -> None:
    """Check that BACKEND could start a run now (exit 0) or not (exit 1)."""
    from potato_queue.runs.service import require_backend

    cfg = _checked(config)
    require_backend(cfg, backend)
    from potato_queue.executors import build_executor, unavailable_reason

    if unavailable_reason(cfg, backend) is not None:
        raise _not_built(f"training check {backend}", f"the {cfg.model_training.backends[backend].type} backend's work")
    if cfg.model_training.backend_config(backend).type == "agent":
        from potato_queue.agent_admin import agent_check

        store, _ = _store_and_queue(cfg, _redis_checked(redis_url))
        report = agent_check(store, backend, str(config))
    else:
        from potato_queue.host.llm_fit import ModelAsk

        report = build_executor(cfg, backend).check(ModelAsk(llm, load_in_4bit) if llm else None)
    from potato_queue.store.potato_ledger import ledger_status

    writeback = ledger_status(cfg)
    data, lines = {"ok": report.ok, **report.data, "potato_writeback": vars(writeback)}, [*report.lines, writeback.line()]
    click.echo(json.dumps(data) if as_json else "\n".join(lines))
    if not report.ok:
        raise click.exceptions.Exit(1)


@training.command()
@click.argument("backend")
@CONFIG
@REDIS
def register(backend: str, config: Path, redis_url: str) -> None:
    """Issue a token for an agent BACKEND (printed once; replaces the old one)."""
    from potato_queue.agent_admin import agent_backend_checked, register_text
    from potato_queue.code_package import agent_zipapp

    cfg = _checked(config)
    agent_backend_checked(cfg, backend)
    store, _ = _store_and_queue(cfg, _redis_checked(redis_url))
    click.echo(register_text(backend, store.agents.issue(backend), store.presence.server_url(), agent_zipapp().sha256))


@training.command(context_settings={"ignore_unknown_options": True, "help_option_names": []},
                  add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def agent(args: tuple[str, ...]) -> None:
    """Run an agent backend's runs on this machine until stopped (token from POTATO_TRAINING_TOKEN)."""
    # The standard-library agent owns its options (the same ones agent.pyz takes): --server, --backend,
    # --token-file, --python, --once, --workdir, --keep, --ca-file; -h lists them.
    from potato_queue.agent.__main__ import serve_main

    raise click.exceptions.Exit(serve_main(list(args), prog="potato-queue training agent"))


@training.command()
@CONFIG
@REDIS
@click.option("--trainer", required=True, help="e.g. sklearn-text, hf-text-classification, majority-baseline.")
@click.option("--schema", "schemas", multiple=True, required=True, help="A scheme to train on (repeat for several).")
@click.option("--backend", default=None, help="Where it runs (default: model_training.backend, else local).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A trainer parameter, e.g. --param epochs=3 (repeat; JSON values like 3, 0.1, true are typed).")
@click.option("--follow", is_flag=True, help="Watch it to the end, print the held-out scores; exit 0/1/4.")
@click.option("--learning-curve", is_flag=True, help="Also fit on 25/50/75 % of the train items (params.learning_curve).")
def run(config: Path, redis_url: str, trainer: str, schemas: tuple[str, ...], backend: str | None,
        params: tuple[str, ...], follow: bool, learning_curve: bool) -> None:
    """Queue a training run (--follow: watch it to the end and print the held-out scores)."""
    from potato_queue import follow as following

    runs = _runs(_checked(config), _redis_checked(redis_url))
    record = runs.submit(trainer=trainer, schemas=list(schemas), backend=backend, trigger="cli",
                         params={**_params(params), **({"learning_curve": True} if learning_curve else {})})
    click.echo(f"queued run {record['run_id']} ({trainer} on {record['backend']})")
    if follow:
        raise click.exceptions.Exit(following.follow(runs.store, record["run_id"]))


@training.command()
@CONFIG
@REDIS
def runs(config: Path, redis_url: str) -> None:
    """List the project's runs."""
    from potato_queue.follow import runs_table
    from potato_queue.runs.retrain import last_check

    cfg = _checked(config)
    store, _ = _store_and_queue(cfg, _redis_checked(redis_url))
    click.echo(runs_table(store.list_runs()))
    if cfg.model_training.auto_retrain.enabled:
        click.echo(f"auto-retrain: {last_check(cfg, store)['reason']}")


@training.command()
@click.argument("run_id")
@CONFIG
@REDIS
def cancel(run_id: str, config: Path, redis_url: str) -> None:
    """Cancel a queued or running run."""
    from potato_queue.run import RunState

    state = _runs(_checked(config), _redis_checked(redis_url)).cancel(run_id)
    click.echo(f"{run_id}: {state}" + ("" if state == RunState.CANCELLED else " (cancel requested; the worker is being stopped)"))


@training.command()
@click.argument("run_id")
@CONFIG
@click.option("-f", "--follow", is_flag=True)
def logs(run_id: str, config: Path, follow: bool) -> None:
    """Print a run's log (-f: keep printing until the run ends)."""
    from potato_queue.follow import print_log
    from potato_queue.store.keys import RunPaths

    cfg = _checked(config)
    try:
        paths = RunPaths.of(cfg, run_id)
    except ValueError:
        raise PotatoQueueError(f"{run_id!r} is not a run id (they look like 20261129T120000-a1b2c3)") from None
    if not paths.run_json.exists():
        raise PotatoQueueError(f"no run {run_id!r} in this project", fix="list them with: potato-queue training runs CONFIG")
    print_log(paths, follow=follow)


@training.command()
@CONFIG
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--schema", "schemas", multiple=True, help="A scheme to train on (repeat; default: every scheme with a target).")
def bundle(config: Path, out: Path, schemas: tuple[str, ...]) -> None:
    """Write the bundle a run would get, to inspect it."""
    from potato_queue.bundle import build_bundle

    manifest = build_bundle(_checked(config), out, list(schemas) or None)
    sizes = ", ".join(f"{name} {entry['n']}" for name, entry in manifest["splits"].items())
    click.echo(f"bundle: {sizes} ({', '.join(s['name'] for s in manifest['schemas'])})")
    for text in manifest["stats"]["warnings"]:
        click.echo(f"warning: {text}")
    click.echo(f"digest: {manifest['digest']}")
    click.echo(f"written to {out.resolve()}")


def _params(pairs: tuple[str, ...]) -> dict[str, Any]:
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


def _runs(cfg: ProjectConfig, redis_url: str) -> Any:
    """The project's RunService, as the server has it (the same rules for a command as for the API)."""
    from potato_queue.runs.service import RunService

    return RunService(cfg, *_store_and_queue(cfg, redis_url))


def _store_and_queue(cfg: ProjectConfig, redis_url: str) -> tuple[Any, Any]:
    from potato_queue.processes.queue import enqueue, make_celery
    from potato_queue.store import RunStore
    from potato_queue.store.plumbing import client_for

    app = make_celery(cfg, redis_url)
    return RunStore(cfg, client_for(redis_url)), lambda run_id: enqueue(app, cfg, run_id)


# What potato-queue writes (run folders, bundles, logs, predictions, models) holds annotation data:
# readable by this account only, in every process it starts (they inherit the umask).
UMASK = 0o077


def _add_command_modules() -> None:
    from potato_queue.cli_insight import insight_commands
    from potato_queue.cli_potato import potato
    from potato_queue.cli_retry import retry_command

    def runs_for(config: Path, url: str) -> Any:
        return _runs(_checked(config), _redis_checked(url))

    cli.add_command(potato)
    for command in (retry_command(CONFIG, REDIS, runs_for), *insight_commands(CONFIG, REDIS, runs_for)):
        training.add_command(command)


_add_command_modules()


def main(argv: list[str] | None = None) -> None:
    os.umask(UMASK)
    cli.main(args=argv, prog_name="potato-queue")


if __name__ == "__main__":
    main()
