"""`potato-queue training check | register | agent`: the backends, and the agents of agent backends."""

from __future__ import annotations

import json
from pathlib import Path

import click

from potato_queue.cli.options import CONFIG, REDIS, checked, redis_checked, store_for

__all__ = ["check", "register", "agent"]


@click.command()
@click.argument("backend")
@CONFIG
@REDIS
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--llm", metavar="MODEL", help="Also whether hf-llm-lora can fine-tune MODEL there (GPU memory, bitsandbytes)."
)
@click.option("--load-in-4bit", type=click.Choice(["auto", "true", "false"]), default="auto", show_default=True)
def check(backend: str, config: Path, redis_url: str, as_json: bool, llm: str | None, load_in_4bit: str) -> None:
    """Check that BACKEND could start a run now (exit 0) or not (exit 1)."""
    from potato_queue.host.llm_fit import ModelAsk
    from potato_queue.lab.events import routing_lines
    from potato_queue.runs.budget import budget_standing
    from potato_queue.runs.service import RunService
    from potato_queue.store.potato_compat import ledger_status

    cfg = checked(config)
    # Not pinged first: only an agent backend's check reads Redis (its registration), and it says so when none answers.
    service = RunService(cfg, store_for(cfg, redis_url))
    report = service.check(backend, ModelAsk(llm, load_in_4bit) if llm else None)
    writeback = ledger_status(cfg)
    webhooks = routing_lines(cfg)
    budget = budget_standing(cfg, service.store)
    data, lines = (
        {"ok": report.ok, **report.data, "potato_writeback": vars(writeback), "webhooks": webhooks, "budget": budget},
        [*report.lines, writeback.line(), *webhooks, *(f"budget: {cap['said']}" for cap in budget["caps"])],
    )
    click.echo(json.dumps(data) if as_json else "\n".join(lines))
    if not report.ok:
        raise click.exceptions.Exit(1)


@click.command()
@click.argument("backend")
@CONFIG
@REDIS
def register(backend: str, config: Path, redis_url: str) -> None:
    """Issue a token for an agent BACKEND (printed once; replaces the old one)."""
    from potato_queue.cli.agents import agent_backend_checked, register_text
    from potato_queue.code_package import agent_zipapp

    cfg = checked(config)
    agent_backend_checked(cfg, backend)
    store = store_for(cfg, redis_checked(redis_url))
    click.echo(register_text(backend, store.agents.issue(backend), store.presence.server_url(), agent_zipapp().sha256))


@click.command(context_settings={"ignore_unknown_options": True, "help_option_names": []}, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def agent(args: tuple[str, ...]) -> None:
    """Run an agent backend's runs on this machine until stopped (token from POTATO_TRAINING_TOKEN)."""
    # The standard-library agent owns its options (the same ones agent.pyz takes): --server, --backend,
    # --token-file, --python, --once, --workdir, --keep, --ca-file; -h lists them.
    from potato_queue.agent.__main__ import serve_main

    raise click.exceptions.Exit(serve_main(list(args), prog="potato-queue training agent"))
