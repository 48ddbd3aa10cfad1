"""`potato-queue training run | runs | cancel | retry | rerun | rater | logs | bundle | budget`: a project's runs from the command line,
through the same RunService as the API."""

from __future__ import annotations

from pathlib import Path

import click

from potato_queue.cli.options import (
    CONFIG,
    REDIS,
    checked,
    params_of,
    redis_checked,
    run_command,
    runs_for,
    store_for,
)

__all__ = ["run", "runs", "cancel", "retry", "rerun", "rater", "logs", "bundle", "budget"]


@click.command()
@CONFIG
@REDIS
@click.option("--trainer", required=True, help="e.g. sklearn-text, hf-text-classification, majority-baseline.")
@click.option("--schema", "schemas", multiple=True, required=True, help="A scheme to train on (repeat for several).")
@click.option("--backend", default=None, help="Where it runs (default: model_training.backend, else local).")
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="A trainer parameter, e.g. --param epochs=3 (repeat; JSON values like 3, 0.1, true are typed).",
)
@click.option("--follow", is_flag=True, help="Watch it to the end, print the held-out scores; exit 0/1/4.")
@click.option(
    "--learning-curve", is_flag=True, help="Also fit on 25/50/75 % of the train items (params.learning_curve)."
)
def run(
    config: Path,
    redis_url: str,
    trainer: str,
    schemas: tuple[str, ...],
    backend: str | None,
    params: tuple[str, ...],
    follow: bool,
    learning_curve: bool,
) -> None:
    """Queue a training run (--follow: watch it to the end and print the held-out scores)."""
    from potato_queue.cli.output import follow as following

    service = runs_for(config, redis_url)
    record = service.submit(
        trainer=trainer,
        schemas=list(schemas),
        backend=backend,
        trigger="cli",
        params={**params_of(params), **({"learning_curve": True} if learning_curve else {})},
    )
    click.echo(f"queued run {record['run_id']} ({trainer} on {record['backend']})")
    if follow:
        raise click.exceptions.Exit(following(service.store, record["run_id"]))


@click.command()
@CONFIG
@REDIS
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1), help="The newest this many.")
@click.option("--all", "every", is_flag=True, help="Every run the project has, newest first.")
@click.option("--before", default=None, metavar="RUN_ID", help="Only runs older than this one (the next page).")
@click.option("--agreement", is_flag=True, help="Also how each run agrees with the annotators, a line a scheme.")
def runs(config: Path, redis_url: str, limit: int, every: bool, before: str | None, agreement: bool) -> None:
    """List the project's runs, newest first (--limit, --all, --before for older pages)."""
    from potato_queue.cli.output import agreement_lines, runs_table
    from potato_queue.errors import NotFound
    from potato_queue.runs.retrain import last_check

    cfg = checked(config)
    store = store_for(cfg, redis_checked(redis_url))
    try:
        records, total, older = store.runs_page(max(1, len(store.run_ids())) if every else limit, before)
    except KeyError:
        raise NotFound(f"No run {before!r} in this project", fix="training runs lists them") from None
    click.echo(runs_table(records))
    if agreement:
        click.echo(agreement_lines(records))
    if older is not None:
        click.echo(
            f"the newest {len(records)} of {total} runs{f' before {before}' if before else ''}; older ones: "
            f"--before {older} (or --all)"
        )
    if cfg.model_training.auto_retrain.enabled:
        click.echo(f"auto-retrain: {last_check(cfg, store)['reason']}")


@run_command()
def cancel(run_id: str, config: Path, redis_url: str) -> None:
    """Cancel a queued or running run."""
    from potato_queue.run import RunState

    state = runs_for(config, redis_url).cancel(run_id)
    click.echo(
        f"{run_id}: {state}"
        + ("" if state == RunState.CANCELLED else " (cancel requested; the worker is being stopped)")
    )


@run_command()
@click.option("--backend", default=None, help="Where to run it again (by default its own backend).")
@click.option("--follow", is_flag=True, help="Watch it to the end, then print the comparison with the original.")
def rerun(run_id: str, config: Path, redis_url: str, backend: str | None, follow: bool) -> None:
    """Run an ended run again on the same bundle, trainer, schemes, params and seed, to see whether it
    reproduces: the scores, McNemar's test and what made each run differently (code, packages, GPU, host)."""
    from potato_queue.cli.insight import comparison_table, loaded
    from potato_queue.cli.output import follow as following
    from potato_queue.insight.compare import compare_runs
    from potato_queue.run import RunState

    service = runs_for(config, redis_url)
    record = service.rerun(run_id, backend)
    again = record["run_id"]
    click.echo(f"queued run {again}, run {run_id} again ({record['trainer']} on {record['backend']})")
    if follow:
        code = following(service.store, again)
        if {service.record(again)["state"], service.record(run_id)["state"]} == {RunState.SUCCEEDED}:
            found = compare_runs(service.config, loaded(service, run_id), loaded(service, again))
            click.echo("\n" + comparison_table(found))
        raise click.exceptions.Exit(code)


@run_command()
@click.option("--remove", is_flag=True, help="Take the run's rater out of Potato, every answer of it.")
def rater(run_id: str, config: Path, redis_url: str, remove: bool) -> None:
    """Make a succeeded run a machine rater in Potato (its held-out answers, beside the annotators' in Potato's
    agreement report and adjudication), or take it out with --remove."""
    from potato_queue.runs.rater import HELD_OUT_NOTE

    service = runs_for(config, redis_url)
    if remove:
        click.echo(f"{run_id}: removed from Potato as the machine rater {service.remove_rater(run_id)}")
        return
    made = service.make_rater(run_id)
    replaced = f", replacing run {made['replaced']}'s answers" if made.get("replaced") not in (None, run_id) else ""
    click.echo(
        f"{run_id}: a machine rater in Potato as {made['id']}, {made['items']} items {HELD_OUT_NOTE}{replaced}; "
        "a running Potato shows it from its next start"
    )


@run_command()
@click.option("--follow", is_flag=True, help="Watch the retry to the end, print the held-out scores; exit 0/1/4.")
def retry(run_id: str, config: Path, redis_url: str, follow: bool) -> None:
    """Retry a failed or cancelled run: a new run on the same data that resumes from its last checkpoint."""
    from potato_queue.cli.output import follow as following

    service = runs_for(config, redis_url)
    record = service.retry(run_id)
    click.echo(
        f"queued run {record['run_id']}, the retry of run {run_id} ({record['trainer']} on "
        f"{record['backend']}): it resumes from run {run_id}'s checkpoint where the machine has one"
    )
    if follow:
        raise click.exceptions.Exit(following(service.store, record["run_id"]))


@click.command()
@click.argument("run_id")
@CONFIG
@click.option("-f", "--follow", is_flag=True)
def logs(run_id: str, config: Path, follow: bool) -> None:
    """Print a run's log (-f: keep printing until the run ends)."""
    from potato_queue.cli.output import print_log
    from potato_queue.runs.service import RunService

    cfg = checked(config)
    # No Redis is asked: a run's log is read from its folder (RunService.log_on_disk).
    print_log(RunService(cfg, store_for(cfg, cfg.settings.redis_url)), run_id, follow=follow)


@click.command()
@CONFIG
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--schema", "schemas", multiple=True, help="A scheme to train on (repeat; default: every scheme with a target)."
)
def bundle(config: Path, out: Path, schemas: tuple[str, ...]) -> None:
    """Write the bundle a run would get, to inspect it."""
    from potato_queue.bundle import build_bundle

    manifest = build_bundle(checked(config), out, list(schemas) or None)
    sizes = ", ".join(f"{name} {entry['n']}" for name, entry in manifest["splits"].items())
    click.echo(f"bundle: {sizes} ({', '.join(s['name'] for s in manifest['schemas'])})")
    for text in manifest["stats"]["warnings"]:
        click.echo(f"warning: {text}")
    click.echo(f"digest: {manifest['digest']}")
    click.echo(f"written to {out.resolve()}")


@click.command()
@CONFIG
@REDIS
@click.option("--strike", "strike_run", default=None, metavar="RUN_ID", help="Strike an ended run's GPU use.")
@click.option("--reason", default=None, help="Why the struck run's use counts toward no budget (with --strike).")
def budget(config: Path, redis_url: str, strike_run: str | None, reason: str | None) -> None:
    """The month's GPU budget: what each cap used and has left; --strike RUN_ID --reason TEXT takes a run's use
    out of every budget (a host that sent figures no run could use), recorded in the run."""
    from potato_queue.runs.budget import budget_standing

    service = runs_for(config, redis_url)
    if strike_run is not None:
        struck = service.strike_usage(strike_run, reason or "")
        click.echo(
            f"{strike_run}: its GPU use ({struck['gpu_hours']:.3g} GPU-hours, {struck['kwh']:.3g} kWh) counts "
            f"toward no budget now: {struck['reason']}"
        )
    caps = budget_standing(service.config, service.store)["caps"]
    for cap in caps:
        click.echo(f"budget: {cap['said']}")
    if not caps:
        click.echo("budget: the project sets no cap (model_training.budget)")
