"""One run, start to finish: spec, bundle, trainer, fit, predict, result.

:func:`run` never raises; it reports a ``result`` or an ``error`` (or a
``status cancelled``) event and returns the exit code of protocol.md:
0 ok, 1 unexpected, 2 bad spec/bundle/trainer, 3 missing dependency,
4 cancelled, 5 out of memory.
"""

import copy
import os
import sys
import time
import traceback
from typing import Dict, Optional

from potato_queue.wire.checkpoint import Checkpoints, default_checkpoint_dir
from potato_queue.wire.events import Reporter
from potato_queue.wire.exit_codes import EXIT_CANCELLED, EXIT_OK, EXIT_PREEMPTED, EXIT_UNEXPECTED
from potato_queue.wire.isolated import RUN_ID_VAR, python_argv
from potato_queue.wire.scoring import score

from .api import FitResult, RunContext, Trainer
from .bundle import Bundle, load_bundle
from .curve import fit_curve, quiet, report_full_point, scratch_checkpoints, wants_curve
from .device import (
    apply_gpus,
    apply_thread_env,
    apply_torch_threads,
    describe_device,
    gpu_env_note,
    resolve_device,
)
from .environment import environment
from .errors import Cancelled, Preempted, ValidationFailed, WorkerError, classify
from .loading import load_trainer
from .memory import MemoryWatchdog
from .parallel import RankInfo
from .predictions import PREDICTIONS_FILE, PredictionSummary, predict_items, write_predictions
from .spec import Spec, load_spec, with_bundle_schemas
from .stop import StopFlag

__all__ = ["run"]


class _State:
    """What the failure handler needs to know about how far the run got."""

    def __init__(self) -> None:
        self.trainer_name = ""
        self.install_hint = ""
        self.watchdog: Optional[MemoryWatchdog] = None


def run(spec_path: str, reporter: Reporter, stop: StopFlag, rank: Optional[RankInfo] = None) -> int:
    """Do the run described by *spec_path* (as one rank of a data-parallel run: *rank*); return its exit code."""
    state = _State()
    try:
        return _run(spec_path, reporter, state, stop, rank)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - the process boundary
        stop.finishing = True
        return _fail(reporter, stop, state, exc)
    finally:
        stop.finishing = True
        if state.watchdog is not None:
            state.watchdog.stop()
        reporter.flush()


def _fail(reporter: Reporter, stop: StopFlag, state: _State, exc: BaseException) -> int:
    if stop.preempted or isinstance(exc, Preempted):
        reporter.status("preempted", "stopped on %s: %s" % (stop.signal_name or "SIGUSR1", exc))
        return EXIT_PREEMPTED
    if stop.is_set() or isinstance(exc, (Cancelled, KeyboardInterrupt)):
        why = stop.signal_name or type(exc).__name__
        reporter.status("cancelled", "stopped on %s: %s" % (why, exc) if str(exc) else "stopped on %s" % why)
        return EXIT_CANCELLED
    failure = classify(exc, state.trainer_name, state.install_hint)
    reporter.error(failure.code, failure.message, failure.install_hint)
    if failure.exit_code == EXIT_UNEXPECTED and not isinstance(exc, WorkerError):
        sys.stderr.write(traceback.format_exc())  # the whole of it, in the worker's own stderr
        reporter.log("error", _where(exc))
    return failure.exit_code


def _where(exc: BaseException) -> str:
    """The last exception and where it was raised, in one line (run.log), not a flattened traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    at = (
        " at {}:{} in {}".format(os.path.basename(frames[-1].filename), frames[-1].lineno, frames[-1].name)
        if frames
        else ""
    )
    first = (str(exc).strip().splitlines() or [""])[0][:500]
    return "{}: {}{}".format(type(exc).__name__, first, at)


def _check_stop(stop: StopFlag, where: str) -> None:
    # Not ctx.check_stop(): that is the trainer's poll, which arms the flag (stop.py).
    if stop.is_set():
        raise Cancelled("Cancelled " + where)


def _run(spec_path: str, reporter: Reporter, state: _State, stop: StopFlag, rank: Optional[RankInfo]) -> int:
    reporter.status("running", "reading the spec")
    spec = load_spec(spec_path)
    os.environ[RUN_ID_VAR] = spec.run_id  # inherited by what the trainer starts: the agent's leak guard reads it
    state.trainer_name = spec.trainer
    curve = wants_curve(spec.params)
    if rank is None:
        world = _world(spec)
        if world > 1 and curve:
            raise ValidationFailed(
                "a learning curve's fits run in one process, and this run would train "
                'data-parallel on %d GPUs: give it one GPU (ssh gpus: "0", a SLURM job\'s '
                "gres gpu:1) or leave learning_curve out" % world
            )
        if world > 1:
            return _data_parallel(spec_path, spec, world, reporter)
    else:  # one rank of several: its own GPU and its share of the threads
        spec.limits.device, spec.limits.num_threads = rank.device, rank.threads or spec.limits.num_threads
    apply_thread_env(spec.limits.num_threads)
    apply_gpus(spec.gpus)
    state.watchdog = _start_watchdog(spec, reporter)
    reporter.status("running", "loading the bundle")
    bundle = load_bundle(spec.bundle_dir)
    spec.schemas = with_bundle_schemas(spec.schemas, bundle.manifest.get("schemas"))
    reporter.status("running", "loading trainer %s" % spec.trainer)
    trainer, state.install_hint = load_trainer(spec.trainer, spec.params)
    if curve and not trainer.learns_from_train:
        raise ValidationFailed(
            "%s learns nothing from the train items, so it has no learning curve: leave "
            "learning_curve out" % spec.trainer
        )
    ctx = _context(spec, bundle, reporter, trainer, stop, rank)
    problems = trainer.validate(ctx)
    if problems:
        raise ValidationFailed("; ".join(problems))
    _check_stop(stop, "before fitting")
    if curve:
        fit_curve(
            ctx,
            lambda: load_trainer(spec.trainer, spec.params)[0],
            lambda part, workdir: _partial_context(ctx, part, workdir, stop),
        )
    fit_started_s = time.monotonic()
    reporter.status("running", "fitting")
    result = trainer.fit(ctx)
    if not ctx.main_rank:
        return EXIT_OK  # rank 0 has the same model: it predicts and reports
    _check_stop(stop, "after fitting")
    _predict_and_report(ctx, trainer, bundle, result, fit_started_s if curve else None)
    ctx.checkpoints.remove_all()  # the run is done: nothing will resume from them
    return EXIT_OK


def _predict_and_report(
    ctx: RunContext, trainer: Trainer, bundle: Bundle, result: FitResult, curve_started_s: Optional[float]
) -> None:
    """The fit's model files, its predictions, and the result with the held-out scores (and, for a learning
    curve, its 100 % point, timed from `curve_started_s`)."""
    _report_artifacts(ctx, result)
    ctx.reporter.status("evaluating", "predicting val, test and unlabeled items")
    summary = write_predictions(ctx, trainer, predict_items(bundle))
    ctx.reporter.artifact(PREDICTIONS_FILE, os.path.getsize(summary.path))
    metrics = dict(result.metrics)
    metrics.update(_score(ctx, summary, result.steps))
    if curve_started_s is not None:
        report_full_point(ctx, bundle.split_size("train"), metrics, time.monotonic() - curve_started_s)
    ctx.reporter.result(
        model_version=result.model_version,
        metrics=metrics,
        label_order=result.label_order,
        notes=result.notes,
        predictions_file=PREDICTIONS_FILE,
        n_predictions=summary.count,
        environment=environment(),
    )


def _start_watchdog(spec: Spec, reporter: Reporter) -> Optional[MemoryWatchdog]:
    if not spec.limits.max_ram_mb:
        return None

    def exceeded(message: str) -> None:
        reporter.error("out_of_memory", message)
        reporter.flush()

    return MemoryWatchdog(spec.limits.max_ram_mb, exceeded).start()


def _checkpoint_every_steps(spec: Spec, trainer: Trainer) -> int:
    value = spec.params.get("checkpoint_every_steps", trainer.checkpoint_every_steps)
    if value is None:
        return trainer.checkpoint_every_steps
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationFailed(
            "params.checkpoint_every_steps must be a whole number of steps, 0 for none, got %r" % (value,)
        )
    return value


def _world(spec: Spec) -> int:
    """How many data-parallel ranks the run gets (1: in this process)."""
    from .parallel import world_for

    try:
        from potato_queue.trainers.registry import get_trainer_class

        data_parallel = get_trainer_class(spec.trainer).data_parallel
    except (KeyError, ImportError):
        return 1  # load_trainer says why, in this process
    return world_for(spec.limits.device, data_parallel, os.environ)


def _data_parallel(spec_path: str, spec: Spec, world: int, reporter: Reporter) -> int:
    """Run the spec as `world` rank processes (ranks.py); their exit code."""

    from .parallel import cpu_ranks, describe_parallel, free_port, rank_launches, threads_per_rank
    from .ranks import run_ranks

    threads = threads_per_rank(spec.limits.num_threads, world, os.cpu_count())
    launches = rank_launches(
        python_argv(sys.executable, "potato_queue.worker", []),
        os.path.abspath(spec_path),
        world,
        cpu_ranks(os.environ) < 2,
        free_port(),
        threads,
    )
    reporter.log("info", describe_parallel(launches, os.environ))
    return run_ranks(launches, reporter)


def _context(
    spec: Spec, bundle: Bundle, reporter: Reporter, trainer: Trainer, stop: StopFlag, rank: Optional[RankInfo]
) -> RunContext:
    """Apply device and thread limits; make the workdir; build the context."""
    device = resolve_device(spec.limits.device, trainer.uses_torch, reporter.log)
    if trainer.uses_torch:
        apply_torch_threads(spec.limits.num_threads)
    reporter.log("info", "Running %s on %s%s" % (spec.trainer, describe_device(device), gpu_env_note()))
    os.makedirs(spec.workdir, exist_ok=True)
    checkpoints = Checkpoints(
        spec.checkpoint_dir or default_checkpoint_dir(spec.workdir), _checkpoint_every_steps(spec, trainer)
    )
    return RunContext(spec, bundle, reporter, device, checkpoints, lambda: stop.preempted, rank)


def _partial_context(ctx: RunContext, part: Bundle, workdir: str, stop: StopFlag) -> RunContext:
    """A learning curve's partial fit: the run's device and stops, its own bundle, folder and reporter."""
    spec = copy.copy(ctx.spec)
    spec.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    return RunContext(
        spec, part, quiet(ctx.reporter), ctx.device, scratch_checkpoints(workdir), lambda: stop.preempted, ctx.rank
    )


def _report_artifacts(ctx: RunContext, result: FitResult) -> None:
    """One ``artifact`` event per file the trainer wrote (folders are walked)."""
    for relative in result.artifact_paths:
        full = os.path.join(ctx.workdir, relative)
        if os.path.isdir(full):
            for folder, _dirs, files in sorted(os.walk(full)):
                for name in sorted(files):
                    path = os.path.join(folder, name)
                    ctx.reporter.artifact(os.path.relpath(path, ctx.workdir), os.path.getsize(path))
        elif os.path.isfile(full):
            ctx.reporter.artifact(relative, os.path.getsize(full))
        else:
            ctx.reporter.log("warning", "The trainer listed %s as an artifact but did not write it" % relative)


def _score(ctx: RunContext, summary: PredictionSummary, step: int) -> Dict[str, float]:
    """Held-out accuracy and macro-F1 per split and schema, as metric events."""
    metrics: Dict[str, float] = {}
    for schema in ctx.schemas:
        for split in ("val", "test"):
            scores = score(
                summary.targets.get((split, schema.name), {}),
                summary.predicted.get((split, schema.name), {}),
                schema.kind,
                ctx.bundle.scale(schema.name).get("points"),
            )
            if not scores["n"]:
                continue
            for name in ("accuracy", "macro_f1", "micro_f1", "mae", "spearman", "qwk"):
                if scores.get(name) is None:
                    continue  # each kind has its own (micro-F1: multilabel; MAE, Spearman: a scale; QWK: ordinal)
                ctx.reporter.metric(split, ctx.metric_name(schema, name), scores[name], step)
                metrics[ctx.metric_name(schema, "%s_%s" % (split, name))] = scores[name]
            metrics[ctx.metric_name(schema, "%s_n" % split)] = scores["n"]
    return metrics
