"""`potato-queue up`: everything on this machine, for a laptop or the README's demo.

Uses the configured Redis when one answers, else starts a private one on a
unix socket; then the server, one executor and (with auto_retrain enabled)
beat as child processes. With
--run it queues a training run per trainer given, follows each, prints the
held-out scores (side by side when several) and stops everything; without,
it runs until Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.potato_hook import TRAINER_NAME
from potato_queue.processes.embedded_redis import EmbeddedRedis, ping
from potato_queue.settings import REDIS_URL_ENV, WARNINGS_SHOWN_ENV
from potato_queue.store.keys import potato_database_path
from potato_queue.store.plumbing import client_for

__all__ = ["up"]


# The runs `up --run` makes, in order: (trainer, its schemes, its params).
Planned = list[tuple[str, list[str], dict[str, Any]]]


def _spawn(args: list[str], env: dict[str, str], **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "potato_queue.cli", *args], env=env, text=True, start_new_session=True, **kw
    )  # type: ignore[call-overload]


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _pass_on(stream: IO[str]) -> None:
    for line in stream:
        print(line.rstrip("\n"), flush=True)


def _exit_on(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def params_by_trainer(trainers: list[str], params: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each --run trainer with the --param values it declares; a param no trainer has is refused."""
    from potato_queue.runs.submit import trainer_table

    table = trainer_table()
    declared = {name: set(table[name]["params"]) if name in table else set() for name in trainers}
    stray = sorted(key for key in params if not any(key in names for names in declared.values()))
    if stray:
        raise PotatoQueueError(
            f"--param {stray[0]} is not a param of {', '.join(trainers) or 'any --run trainer'}",
            fix="drop it, or add the trainer it is for (GET /admin/training/api/trainers lists each trainer's params)",
            exit_code=2,
        )
    return [(name, {k: v for k, v in params.items() if k in declared[name]}) for name in trainers]


def planned_runs(config: ProjectConfig, trainers: list[tuple[str, dict[str, Any]]], schemas: list[str]) -> Planned:
    """Every --run checked before anything starts (its schemes, its kinds, its backend, its params), so that an
    `up` whose second run would be refused queues nothing: (trainer, schemes, params) in order. No `schemas`:
    each trainer gets the schemes of the kinds it trains."""
    from potato_queue.runs.kinds import schemas_for
    from potato_queue.runs.submit import check_params, choose_backend

    planned = []
    for trainer, params in trainers:
        chosen = list(schemas) or schemas_for(config, trainer)
        choose_backend(config, trainer, chosen, None)
        planned.append((trainer, chosen, check_params(params)))
    return planned


def up(
    config: ProjectConfig,
    redis_url: str,
    *,
    environ: Mapping[str, str],
    trainers: Planned,
    port: int,
    verbose: bool = False,
) -> int:
    """`environ`: the environment the server, the executor and beat start in (ours, from cli/)."""
    # SIGTERM and SIGHUP would end this process at once, leaving the server, the executor and Redis
    # running under PID 1: as SystemExit they unwind the stack below, which stops every child. Ctrl-C
    # takes the same path, set here: a process started in the background by a shell (`cmd &`) inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt, so Ctrl-C or kill -INT did nothing.
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _exit_on)
    try:
        return _start_and_run(config, redis_url, environ, trainers, port, verbose)
    except KeyboardInterrupt:
        return 130


def _start_and_run(
    config: ProjectConfig, redis_url: str, environ: Mapping[str, str], trainers: Planned, port: int, verbose: bool
) -> int:
    with ExitStack() as stack:
        if not ping(redis_url):
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="potato-queue-redis-"))
            redis = stack.enter_context(EmbeddedRedis(Path(folder)))
            redis_url = redis.url
            print(f"potato-queue: no Redis answered, so one runs privately at {redis_url}", flush=True)
        env = {**environ, REDIS_URL_ENV: redis_url, WARNINGS_SHOWN_ENV: str(config.config_path.resolve())}
        cfg_path = str(config.config_path)
        server = _spawn(["serve", cfg_path, "--port", str(port)], env, stdout=subprocess.PIPE)
        stack.callback(_stop, server)
        assert server.stdout is not None
        where = server.stdout.readline().strip()
        print(where, flush=True)  # where it serves
        # The rest of what it prints, passed on (and the pipe never fills).
        threading.Thread(target=_pass_on, args=(server.stdout,), daemon=True).start()
        executor = _spawn(["executor", cfg_path, "--verbose" if verbose else "--quiet"], env)
        stack.callback(_stop, executor)
        if not trainers:
            if (
                config.model_training.auto_retrain.enabled
                and config.model_training.auto_retrain.trainer != TRAINER_NAME
            ):
                stack.callback(_stop, _spawn(["beat", cfg_path], env))
            return executor.wait()
        from potato_queue.server.guard import PAGE_PREFIX

        return run_in_order(config, redis_url, trainers, page=where.rsplit(" at ", 1)[-1] + PAGE_PREFIX)
    return 0


def run_in_order(config: ProjectConfig, redis_url: str, trainers: Planned, page: str) -> int:
    """Queue a run per planned trainer (they run one at a time, in this order), follow each, compare them; one
    refused as it is queued (a budget) cancels those queued before it, so none runs later unasked."""
    from potato_queue.cli.output import compare_table, follow
    from potato_queue.processes.queue import enqueue, make_celery
    from potato_queue.runs.submit import start_run
    from potato_queue.store import RunStore
    from potato_queue.store.keys import project_predictions_path

    store, app = RunStore(config, client_for(redis_url)), make_celery(config, redis_url)
    print(
        f"potato-queue: the Training page, while this runs: {page} (admin key: admin_api_key in {config.config_path})",
        flush=True,
    )
    records: list[Any] = []
    try:
        for trainer, schemas, params in trainers:
            records.append(
                start_run(
                    config,
                    store,
                    lambda run_id: enqueue(app, config, run_id),
                    trainer=trainer,
                    schemas=schemas,
                    params=params,
                    trigger="cli",
                )
            )
    except PotatoQueueError:
        for record in records:
            store.request_cancel(record["run_id"])
        raise
    worst = 0
    for record in records:
        print(f"\n== {record['trainer']} (run {record['run_id']})", flush=True)
        worst = max(worst, follow(store, record["run_id"], summary=len(records) == 1))
    if len(records) > 1:
        finished = [store.get(record["run_id"]) for record in records]
        print("\nHeld-out scores, the same split for every run:\n" + compare_table(finished))
        print(
            f"\npredictions: {project_predictions_path(config)} (what passes Potato's rules, the newest run's "
            f"per item; each run's own: {store.paths(records[-1]['run_id']).dir.parent}/<run>/predictions.jsonl)"
        )
    print(where_in_potato(store), flush=True)
    return worst


def where_in_potato(store: Any) -> str:
    """Where the runs show in Potato itself, or why they do not."""
    status = store.potato.status
    if not status.on:
        return f"\n{status.line()}"
    config = store.config
    return (
        f"\nIn Potato: these runs are in {potato_database_path(config)}. Start Potato on the project "
        f"(potato start {config.config_path}): its Training page (/admin/training) lists them, and at that start it "
        f"publishes their predictions as prelabels (/admin/model-review; annotators see them pre-filled when "
        f"pre_annotation is on). A Potato already running lists them at once and publishes them at its next start."
    )
