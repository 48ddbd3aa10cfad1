"""One run's life in the executor process: prepare, launch, supervise, finish.

The run's record is held in memory from the moment dispatch took the run:
read once, written once per transition (and once for the job the agent
fetches). Whatever happens, the run ends in a final state, its token is
revoked, and nothing of it is left running on the backend.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.executors import Executors
from potato_queue.executors.base import AgentResult, Executor, LaunchSpec, ModelFilesMissing, RunHandle
from potato_queue.insight.inputs import write_inputs
from potato_queue.run import RunRecord, RunState
from potato_queue.runs.finalize import finalize_predictions
from potato_queue.runs.gate import bundle_split_ids, bundle_summary
from potato_queue.runs.job import build_job, server_url_for
from potato_queue.runs.rater import beside_the_annotators
from potato_queue.runs.reproducibility import reproducibility
from potato_queue.runs.supervise import Outcome, Watch, supervise
from potato_queue.store import RunStore
from potato_queue.store.lease import Lease
from potato_queue.store.records import FOLDER_FIX, RunFolderError, RunMovedOn, utc_now
from potato_queue.wire.exit_codes import EXIT_CANCELLED, EXIT_OK, EXIT_OOM, EXIT_PREEMPTED

__all__ = ["RunLife", "failure_of"]

TAIL_LINES = 5
# A run token dies with its run (the final state revokes it); this bounds one whose end was never
# recorded. Without max_wall_seconds, as long as a run may be queued in Celery (processes/queue.py).
TOKEN_TTL_UNBOUNDED_S = 30 * 24 * 3600.0
TOKEN_TTL_MARGIN_S = 3600.0
REDIS_RETRY_S = 1.0
PREEMPTED = (
    "preempted: the machine was taken back before the run finished (SLURM preemption or time limit, "
    "SIGUSR1), and the job was not requeued; fix: set requeue: true on the backend so that SLURM requeues "
    "a preempted job and it resumes from its last checkpoint, or start the run again"
)


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])


def failure_of(outcome: Outcome, live: dict[str, Any], cancel_requested: bool) -> tuple[RunState, str | None]:
    """The final state and error of a run that did not succeed."""
    if outcome.state is not None:
        return outcome.state, outcome.error
    code = outcome.result.exit_code if outcome.result else None
    message = live.get("error") or live.get("agent_message")
    if code == EXIT_CANCELLED or cancel_requested:
        # Asked to stop and stopped: a worker killed after ignoring SIGTERM is still a cancelled run.
        return RunState.CANCELLED, None if code == EXIT_CANCELLED else message
    if code == EXIT_OOM:
        return (
            RunState.FAILED,
            message or "The worker ran out of memory (exit 5); use a smaller model or batch, or raise max_ram_mb",
        )
    if code == EXIT_PREEMPTED:
        return RunState.FAILED, PREEMPTED
    return RunState.FAILED, message or f"The worker exited with code {code}; see run.log"


_log = logging.getLogger("potato_queue.runs")

_CANNOT_WRITE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


def _end_line(state: RunState, error: str | None) -> str:
    """A run's last line in run.log: its final state, and why where it failed or was cut short."""
    return f"{state.value}: {error}" if error else state.value


def _said(exc: Exception) -> str:
    """An error as run.log and the run's record say it: ours with its fix, others with their type."""
    if isinstance(exc, PotatoQueueError):
        return f"{exc.message}; fix: {exc.fix}" if exc.fix else exc.message
    if isinstance(exc, redis.RedisError):
        return f"Redis was unreachable ({exc}); the run was stopped. Fix: check that Redis is running, then start the run again"
    if isinstance(exc, OSError) and exc.errno in _CANNOT_WRITE:
        return f"{exc.filename or 'the run folder'} cannot be written: {exc.strerror}; fix: {FOLDER_FIX}"
    return f"{type(exc).__name__}: {exc}"


class _StoreOffer:
    """A pull backend's run, offered to its agents through the store (executors.base.Offer)."""

    def __init__(self, store: RunStore, backend: str, run_id: str) -> None:
        self.store, self.backend, self.run_id = store, backend, run_id

    def post(self) -> None:
        self.store.offers.offer(self.backend, self.run_id)

    def taken(self) -> bool:
        return not self.store.offers.is_offered(self.backend, self.run_id)

    def withdraw(self) -> None:
        self.store.offers.withdraw(self.backend, self.run_id)

    def agent_waiting(self, fresh_s: float) -> dict[str, Any] | None:
        return self.store.offers.agent_waiting(self.backend, fresh_s)


class RunLife:
    """The life of one run that dispatch has moved to `starting` (its record in hand)."""

    def __init__(
        self,
        config: ProjectConfig,
        store: RunStore,
        executors: Executors,
        record: RunRecord,
        lease: Lease,
        started_s: float,
    ) -> None:
        self.config, self.store, self.executors, self.lease = config, store, executors, lease
        self.clock = store.clock  # the one every deadline of the run is counted on
        self.record = record
        self.run_id: str = record["run_id"]
        self.paths = store.paths(self.run_id)
        self.started_s = started_s  # the started_at dispatch wrote, as epoch seconds (max_wall counts from it)
        self.handle: RunHandle | None = None
        self._touched_s = 0.0  # when `supervised` was last touched (epoch s)

    def log(self, message: str) -> None:
        self.store.log(self.run_id, message)

    def step(self, text: str) -> None:
        """The step line the page shows, also kept in run.log."""
        self.store.in_flight.set_live(self.run_id, step=text)
        self.log(text)

    def run(self) -> None:
        try:
            executor = self.executors.get(self.record["backend"])
            # The slot is renewed in every phase: supervision renews it itself; the build, the splits and
            # the end (copy back, predictions into Potato's store) take as long as the project is large.
            with self.lease.kept(alive=self._alive):
                spec = self._prepare(executor)
                self.handle = executor.launch(spec)
            outcome = supervise(self._watch(executor, spec))
            with self.lease.kept(alive=self._alive):
                self._until_recorded(lambda: self._finish(outcome))
        except RunMovedOn as exc:  # ended by another meanwhile (a sweep, a cancel), who recorded why
            if self.handle is not None:
                self.handle.kill()
            self.log(exc.message)
        except Exception as exc:  # the boundary: a run never stays in flight because of us
            if not isinstance(exc, (PotatoQueueError, redis.RedisError)):
                _log.exception("run %s failed on an unexpected error", self.run_id)  # where, for a bug report
            # Kill first, then record: the hard stop never waits on Redis or the disk.
            if self.handle is not None:
                self.handle.kill()
            error = _said(exc)
            self._until_recorded(lambda: self._fail(error))

    def _until_recorded(self, record: Callable[[], None]) -> None:
        """`record()`, again each REDIS_RETRY_S while Redis is unreachable: the run's end is written when it
        answers. run.log is touched meanwhile, so that recovery does not take the run for an orphan."""
        told = False
        while True:
            try:
                record()
                return
            except redis.RedisError as exc:
                if not told:
                    told = True
                    _log.warning(
                        "run %s: Redis is unreachable (%s); its end is recorded once Redis answers", self.run_id, exc
                    )
                with contextlib.suppress(OSError):
                    self.paths.run_log.touch()
                self.clock.wait(REDIS_RETRY_S)

    def _prepare(self, executor: Executor) -> LaunchSpec:
        self.store.in_flight.set_live(self.run_id, step="building the bundle")
        job = build_job(self.config, self.store, self.record, self.paths)
        split_ids = bundle_split_ids(self.paths.bundle_dir)
        self.store.potato.record_splits(self.record, split_ids)
        # Potato's row now with its split sizes and digest; refused (RunMovedOn) if the run ended meanwhile.
        self.store.update(
            self.run_id,
            self.record,
            potato_row=True,
            job=job.to_dict(),
            bundle=bundle_summary(self.paths.bundle_dir, split_ids),
        )
        backend = self.record["backend"]
        # The agent's token lives past the launch's longest wait (a scheduler's pending bound) too.
        ttl_s = self._token_ttl_s() + executor.longest_wait_s()
        token = None if executor.pull else self._launch_token(executor, ttl_s)
        offer = _StoreOffer(self.store, backend, self.run_id) if executor.pull else None
        return LaunchSpec(
            run_id=self.run_id,
            backend_name=backend,
            job=job,
            token=token,
            server_url=server_url_for(self.store),
            paths=self.paths,
            log=self.log,
            step=self.step,
            offer=offer,
            clock=self.clock,
            reissue=functools.partial(self.store.tokens.issue_code, self.run_id, ttl_s)
            if executor.shows_launch
            else None,
        )

    def _launch_token(self, executor: Executor, ttl_s: float) -> str:
        """The run's token for its agent; a one-time code for it where the backend shows what it is given."""
        if executor.shows_launch:
            return self.store.tokens.issue_code(self.run_id, ttl_s)
        return self.store.tokens.issue(self.run_id, ttl_s)

    def _token_ttl_s(self) -> float:
        mt = self.config.model_training
        if not mt.max_wall_seconds:
            return TOKEN_TTL_UNBOUNDED_S
        return mt.max_wall_seconds + mt.grace_seconds + TOKEN_TTL_MARGIN_S

    def _watch(self, executor: Executor, spec: LaunchSpec) -> Watch:
        mt = self.config.model_training
        assert self.handle is not None
        return Watch(
            run_id=self.run_id,
            backend_name=spec.backend_name,
            handle=self.handle,
            store=self.store,
            grace_s=float(mt.grace_seconds),
            heartbeat_timeout_s=mt.heartbeat_timeout_s_of(spec.backend_name),
            max_wall_s=mt.max_wall_seconds,
            started_s=self.started_s,
            launched_s=self.clock.now_s(),
            pending_timeout_s=getattr(executor.backend, "pending_timeout_s", None),
            renew_lease=self.lease.renew,
            lease_lapsed=lambda: self.lease.lapsed,
            on_first_contact=self._first_contact,
            log=self.log,
            step=self.step,
            last_output=lambda: _tail(self.paths.agent_log),
            clock=self.clock,
            alive=self._alive,
        )

    def _alive(self) -> None:
        """The run's `supervised` file, touched at most once a second: on disk, so that it says this executor
        lives while Redis does not answer (runs/recovery.py)."""
        now_s = self.clock.now_s()
        if now_s - self._touched_s < 1.0:
            return
        self._touched_s = now_s
        try:
            self.paths.supervised.touch(mode=0o600)
        except OSError:
            pass  # a folder that takes no writes is the store's to report (records.py)

    def _first_contact(self) -> None:
        # A pull backend's run was queued until its agent claimed it: it starts now.
        started = {"started_at": utc_now(self.store.clock)} if self.record["state"] == RunState.QUEUED else {}
        self.store.transition(self.run_id, RunState.RUNNING, self.record, **started)

    def _finish(self, outcome: Outcome) -> None:
        live = self.store.live(self.run_id)
        result = outcome.result
        if outcome.state is None and result is not None and result.exit_code == EXIT_OK:
            if not self.paths.predictions.exists() and result.message:
                # The worker succeeded but its predictions did not arrive (e.g. over max_predictions_mb).
                outcome = Outcome(result=result, state=RunState.FAILED, error=result.message)
            else:
                return self._succeed(result, live)
        try:
            artifact_uri = self._collect(result)
        except (OSError, PotatoQueueError) as exc:  # the run failed already; this must not hide why
            self.log(f"the model files could not be collected: {_said(exc)}")
            artifact_uri = None
        state, error = failure_of(outcome, live, self.store.in_flight.cancel_requested(self.run_id))
        self.store.transition(
            self.run_id,
            state,
            self.record,
            exit_code=result.exit_code if result else None,
            error=error,
            metrics=self.store.metrics(self.run_id),
            artifact_uri=artifact_uri,
            reproducibility=reproducibility(self.record, (live.get("result") or {}).get("environment")),
            said=_end_line(state, error),
        )

    def _collect(self, result: AgentResult | None) -> str | None:
        assert self.handle is not None
        if result is None:
            self.handle.kill()
            return None
        return self.handle.collect(result)  # the agent reported: bring back (and clean up) what it left

    def _succeed(self, result: AgentResult, live: dict[str, Any]) -> None:
        self.store.transition(self.run_id, RunState.COLLECTING, self.record)
        self.step("collecting the results")
        error = None
        try:
            artifact_uri = self._collect(result)
        except ModelFilesMissing as exc:  # the predictions arrived: they still count
            artifact_uri, error = exc.artifact_uri, exc.message
        held_out, prelabels = finalize_predictions(self.config, self.store, self.record)
        self._keep_insight_inputs()
        state = RunState.FAILED if error else RunState.SUCCEEDED
        reported = live.get("result") or {}
        model_version = reported.get("model_version")
        extra: dict[str, Any] = {}
        if state is RunState.SUCCEEDED:  # before the run is told succeeded: whoever sees it succeeded finds these
            ended = {**self.record, "model_version": model_version, "finished_at": utc_now(self.store.clock)}
            extra = beside_the_annotators(self.config, self.store, ended, self.log)
        self.store.transition(
            self.run_id,
            state,
            self.record,
            exit_code=EXIT_OK,
            held_out=held_out,
            metrics=self.store.metrics(self.run_id),
            error=error,
            artifact_uri=artifact_uri,
            model_version=model_version,
            prelabels=prelabels,
            reproducibility=reproducibility(self.record, reported.get("environment")),
            **extra,
            said=_end_line(state, error),
        )

    def _keep_insight_inputs(self) -> None:
        """insight.json, so that the run's page reads it instead of its whole predictions and bundle; a run
        without it is still looked into, at that cost (insight/inputs.py)."""
        try:
            write_inputs(self.store, self.record)
        except Exception as exc:  # noqa: BLE001 - the run's result stands; its insight is only slower to read
            self.log(
                f"warning: the insight pages' inputs could not be kept ({type(exc).__name__}: {exc}); "
                f"they are worked out from the run's files on each look"
            )

    def _fail(self, error: str) -> None:
        try:
            self.store.transition(
                self.run_id, RunState.FAILED, self.record, error=error, said=_end_line(RunState.FAILED, error)
            )
        except RunFolderError:
            pass  # failed in Redis, the record held there until the folder takes writes again
