"""What an executor process does with a wake-up: take the slot, run the oldest queued run, finalize.

One run at a time per project, in creation order, across any number of
executor processes (API-1): the slot is a Redis lease (SET NX PX, renewed
while supervising), and whoever holds it starts the OLDEST queued run, not
necessarily the one its message named. A lost, duplicated or redelivered
message therefore never reorders or repeats a run: messages are wake-ups,
run states are the truth.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from datetime import datetime
from typing import Any

import redis

from potato_queue.config import LOCAL, ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.executors.base import Executor, Outcome, RunContext, supervise
from potato_queue.keys import Keys
from potato_queue.store import RunStore, utc_now

__all__ = ["Supervisor", "Lease", "ORPHAN_QUIET_S"]

LEASE_TTL_S = 10.0
LEASE_RENEW_S = 1.0
# An in-flight run whose files have not changed for this long, while nobody
# holds the slot, has lost its executor (killed, machine restarted).
ORPHAN_QUIET_S = 15.0
IN_FLIGHT = ("starting", "running", "collecting")
EXECUTOR_STOPPED = ("The executor supervising this run stopped (killed or restarted) before the run "
                    "finished; start the run again")


def _executor_for(kind: str) -> Executor:
    from potato_queue.executors.local import LocalExecutor

    table: dict[str, type[Executor]] = {"local": LocalExecutor}
    if kind not in table:
        raise PotatoQueueError(f"the {kind} backend is not available in this version of potato-queue")
    return table[kind]()



class Lease:
    """The run slot: a Redis key holding our token, renewed at most once a second."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client, self.key = client, key
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._renewed = 0.0

    def try_take(self) -> bool:
        taken = bool(self.client.set(self.key, self.token, nx=True, px=int(LEASE_TTL_S * 1000)))
        self._renewed = time.monotonic() if taken else 0.0
        return taken

    def renew(self) -> bool:
        """False once someone else holds the slot; a slot emptied by a Redis flush is taken back."""
        if time.monotonic() - self._renewed < LEASE_RENEW_S:
            return True
        try:
            holder = self.client.get(self.key)
            if holder is None:
                return self.try_take()
            if holder.decode() != self.token:
                return False
            self.client.pexpire(self.key, int(LEASE_TTL_S * 1000))
        except redis.RedisError:
            return time.monotonic() - self._renewed < LEASE_TTL_S
        self._renewed = time.monotonic()
        return True

    def release(self) -> None:
        try:
            if self.client.get(self.key) == self.token.encode():
                self.client.delete(self.key)
        except redis.RedisError:
            pass


class Supervisor:
    def __init__(self, config: ProjectConfig, redis_url: str) -> None:
        self.config = config
        self.redis_url = redis_url
        self.redis = redis.Redis.from_url(redis_url)
        self.store = RunStore(config, self.redis)
        self.keys = Keys.of(config)

    # -- choosing -------------------------------------------------------------
    def _states(self) -> list[tuple[str, str]]:
        ids = self.store.run_ids()
        pipe = self.redis.pipeline()
        for run_id in ids:
            pipe.hget(self.keys.run(run_id), "state")
        live = pipe.execute()
        out = []
        for run_id, state in zip(ids, live, strict=True):
            out.append((run_id, state.decode() if state else self.store.read(run_id)["state"]))
        return out

    def _orphaned(self, run_id: str) -> bool:
        paths = self.store.paths(run_id)
        newest = max((p.stat().st_mtime for p in (paths.run_log, paths.events, paths.run_json) if p.exists()), default=0)
        return time.time() - newest > ORPHAN_QUIET_S

    def _fail_orphans(self, states: list[tuple[str, str]]) -> bool:
        """Fail in-flight runs whose executor is gone (call with the slot held); True if one is still live."""
        live = False
        for run_id, state in states:
            if state not in IN_FLIGHT:
                continue
            if not self._orphaned(run_id):
                live = True
            elif self.store.transition(run_id, "failed", error=EXECUTOR_STOPPED):
                self.store.log(run_id, EXECUTOR_STOPPED)
        return live

    def _take_oldest_queued(self) -> str | None | bool:
        """Run id now `starting`; None if nothing is queued; False to wait (a run still in flight)."""
        states = self._states()
        if self._fail_orphans(states):
            return False
        for run_id, state in states:
            if state == "queued" and self.store.transition(run_id, "starting", started_at=utc_now()):
                return run_id
        return None

    def sweep_orphans(self) -> None:
        """From the executor's background thread: runs left in flight by a dead executor end failed,
        even when nothing else is queued to make an executor look."""
        lease = Lease(self.redis, self.keys.slot)
        if lease.try_take():  # nobody is supervising a run right now
            try:
                self._fail_orphans(self._states())
            finally:
                lease.release()

    def execute_next(self, woken_by: str | None = None, *, poll_s: float = 0.05) -> str | None:
        """Wait for the slot, then run the oldest queued run. Returns the run id it ran, if any."""
        lease = Lease(self.redis, self.keys.slot)
        last_look = 0.0
        while not lease.try_take():
            if time.monotonic() - last_look > 1.0:  # anything left to wait for? (reads every run's state)
                if not any(state == "queued" for _, state in self._states()):
                    return None
                last_look = time.monotonic()
            time.sleep(poll_s)
        try:
            while True:
                chosen = self._take_oldest_queued()
                if chosen is not False:
                    break
                time.sleep(1.0)
                lease.renew()
            if chosen:
                self._run(chosen, lease)
            return chosen or None
        finally:
            lease.release()

    # -- running ----------------------------------------------------------------
    def _run(self, run_id: str, lease: Lease) -> None:
        record = self.store.read(run_id)
        backend_name = record["backend"]
        backend = None if backend_name == LOCAL else self.config.model_training.backends[backend_name]
        executor = _executor_for(LOCAL if backend is None else backend.type)
        ctx: RunContext | None = None
        try:
            ctx = self._prepare(run_id, record, backend_name, backend)
            executor.start(ctx)
            self.store.transition(run_id, "running")
            outcome = supervise(executor, ctx, renew_lease=lease.renew)
            self._finish(executor, ctx, outcome)
        except Exception as exc:  # the boundary: a run never stays in flight because of us
            self._fail(run_id, exc.message if isinstance(exc, PotatoQueueError) else f"{type(exc).__name__}: {exc}")
            if ctx is not None and "proc" in ctx.state:
                executor.stop(ctx, 0)
        finally:
            self.store.revoke_run_token(run_id)

    def _prepare(self, run_id: str, record: dict[str, Any], backend_name: str, backend: Any) -> RunContext:
        from potato_queue.jobs import build_job, server_url_for

        paths = self.store.paths(run_id)
        self.store.set_live(run_id, step="building the bundle")
        job = build_job(self.config, self.store, record, paths)
        self.store.update(run_id, job=job)
        token = self.store.issue_run_token(run_id)
        started_s = datetime.fromisoformat(record["started_at"].replace("Z", "+00:00")).timestamp()
        return RunContext(run_id=run_id, config=self.config, store=self.store, backend_name=backend_name,
                          backend=backend, server_url=server_url_for(self.redis, self.keys), token=token, job=job,
                          started_s=started_s)

    def _finish(self, executor: Executor, ctx: RunContext, outcome: Outcome) -> None:
        from potato_queue.writeback import finalize_predictions

        run_id = ctx.run_id
        live = self.store.live(run_id)
        if outcome.exit_code == 0 and not ctx.paths.predictions.exists() and live.get("agent_message"):
            # The worker succeeded but its predictions did not arrive (e.g. over max_predictions_mb).
            outcome = Outcome(state="failed", error=str(live["agent_message"]))
        if outcome.exit_code == 0:
            self.store.transition(run_id, "collecting")
            ctx.step("collecting the results")
            executor.collect(ctx)
            held_out = finalize_predictions(self.config, self.store, run_id)
            self.store.transition(run_id, "succeeded", exit_code=0, held_out=held_out,
                                  metrics=live.get("metrics") or {}, error=None,
                                  artifact_uri=self.store.read(run_id).get("artifact_uri"))
            self.store.log(run_id, "succeeded")
            return
        if outcome.exit_code is not None:  # the agent reported: clean up what it left
            executor.collect(ctx)
        state, error = _failure(outcome, live)
        self.store.transition(run_id, state, exit_code=outcome.exit_code, error=error,
                              metrics=live.get("metrics") or {})
        self.store.log(run_id, f"{state}: {error}" if error else state)

    def _fail(self, run_id: str, error: str) -> None:
        if self.store.transition(run_id, "failed", error=error):
            self.store.log(run_id, f"failed: {error}")

    def reconcile(self) -> int:
        """After Redis was emptied: seed live state from disk and wake executors for queued runs."""
        from potato_queue.celery_app import enqueue, make_celery

        woken = 0
        app = None
        for run_id in self.store.run_ids():
            if self.redis.exists(self.keys.run(run_id)):
                continue
            record = self.store.read(run_id)
            self.redis.hsetnx(self.keys.run(run_id), "state", record["state"])
            if record["state"] == "queued":
                app = app or make_celery(self.config, self.redis_url)
                enqueue(app, self.config, run_id)
                self.store.log(run_id, "queued again from disk (Redis had lost the queue)")
                woken += 1
        return woken


def _failure(outcome: Outcome, live: dict[str, Any]) -> tuple[str, str | None]:
    if outcome.state is not None:
        return outcome.state, outcome.error
    code = outcome.exit_code
    if code == 4:
        return "cancelled", None
    message = live.get("error") or live.get("agent_message")
    if code == 5:
        return "failed", message or "The worker ran out of memory (exit 5); use a smaller model or batch, or raise max_ram_mb"
    return "failed", message or f"The worker exited with code {code}; see run.log"
