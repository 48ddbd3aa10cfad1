"""A run in flight as Redis holds it: what changes every second and what passes between its agent and its
executor, apart from the record on disk (the store's `in_flight`).

run.json is written at each change of state; between those writes a run lives in its Redis hash: its state
(seeded from run.json), its step, progress and heartbeat, its metrics, the agent's result with the wake-up
for the supervising executor, the stop flag the agent is told, and the one retry's claim. Everything here
reads or writes that hash and the keys beside it, never the run folder, so it lives apart from the
facade (run_store.py), which decides the state and writes the record.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, cast

import redis
import redis.asyncio as aioredis

from potato_queue.bounds import MAX_METRICS_PER_RUN
from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.run import FINAL_STATES, RunRecord, RunView
from potato_queue.store.keys import Keys
from potato_queue.store.plumbing import CLAIM_FIELD, MERGE_METRICS, RECORD_RESULT, RELEASE_FIELD, wait_published
from potato_queue.store.records import LIVE_JSON, as_text, created_ms

__all__ = ["RunsInFlight", "FINISHED_TTL_S"]

MIN_WAIT_S = 0.01  # the shortest BLPOP; Redis wakes blocked clients every 100 ms (hz 10) anyway
# An ended run's hash and metrics, once run.json holds them: kept this long for whoever still looks (a cancel
# that crossed the end, an executor's last look), then gone, so that Redis holds the live state only, not a
# key or two for every run a project ever made.
FINISHED_TTL_S = 3600


class RunsInFlight:
    """One project's runs as Redis holds them while they run (the store's `in_flight`)."""

    def __init__(self, client: redis.Redis, keys: Keys, clock: Clock = REAL_CLOCK) -> None:
        self.redis, self.keys, self.clock = client, keys, clock
        self._record_result = client.register_script(RECORD_RESULT)
        self._claim_field = client.register_script(CLAIM_FIELD)
        self._release_field = client.register_script(RELEASE_FIELD)

    # -- the state and the live fields ---------------------------------------
    def seed(self, record: RunRecord) -> bool:
        """Redis' view of a run from its record, where Redis has none; True when it had none."""
        run_id, created = record["run_id"], created_ms(record)
        pipe = self.redis.pipeline()
        pipe.hsetnx(self.keys.run(run_id), "state", record["state"])
        pipe.zadd(self.keys.runs, {run_id: created}, nx=True)
        if record["state"] not in FINAL_STATES:
            pipe.zadd(self.keys.unfinished, {run_id: created}, nx=True)
        return bool(pipe.execute()[0])

    def expire_finished(self, run_id: str) -> None:
        """An ended run's keys, its record on disk: gone after FINISHED_TTL_S."""
        pipe = self.redis.pipeline()
        pipe.expire(self.keys.run(run_id), FINISHED_TTL_S)
        pipe.expire(self.keys.metrics(run_id), FINISHED_TTL_S)
        pipe.execute()

    def state(self, run_id: str) -> str | None:
        """The run's state in Redis (None: Redis holds none)."""
        return cast("str | None", as_text(self.redis.hget(self.keys.run(run_id), "state")))

    def live(self, run_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.redis.hgetall(self.keys.run(run_id)).items():
            k, v = as_text(key), as_text(value)
            out[k] = json.loads(v) if k in LIVE_JSON else (float(v) if k == "heartbeat_at" else v)
        return out

    def set_live(self, run_id: str, **fields: Any) -> None:
        mapping: dict[Any, Any] = {
            k: json.dumps(v) if k in LIVE_JSON else str(v) for k, v in fields.items() if v is not None
        }
        if mapping:
            self.redis.hset(self.keys.run(run_id), mapping=mapping)

    def record_batch(self, run_id: str, live: dict[str, str], metrics: dict[str, Any]) -> list[str]:
        """A batch of events' live fields and metrics, with the heartbeat, in one pipeline: the names of new
        metrics refused because the run has MAX_METRICS_PER_RUN names already."""
        pipe = self.redis.pipeline(transaction=False)
        mapping: dict[Any, Any] = {**live, "heartbeat_at": repr(self.clock.now_s())}
        pipe.hset(self.keys.run(run_id), mapping=mapping)
        if metrics:
            pairs = [item for name, value in metrics.items() for item in (name, json.dumps(value))]
            # EVAL, not a registered script: redis-py checks SCRIPT EXISTS before every pipeline that
            # holds one, a round trip per batch on the hot path.
            pipe.eval(MERGE_METRICS, 1, self.keys.metrics(run_id), MAX_METRICS_PER_RUN, *pairs)
        replies = pipe.execute()
        return [as_text(name) for name in replies[1]] if metrics else []

    def metrics(self, run_id: str) -> dict[str, Any]:
        """The run's metrics so far: each `<split>/<name>`'s latest value (what its record keeps at the end)."""
        return {
            as_text(name): json.loads(value) for name, value in self.redis.hgetall(self.keys.metrics(run_id)).items()
        }

    def claim_retry(self, run_id: str, retry_id: str) -> str | None:
        """Make `retry_id` the one retry of run `run_id`, in one Redis step: None when it is, else the id of
        the retry that claimed it first (two retries asked at once: one wins)."""
        winner = self._claim_field(keys=[self.keys.run(run_id)], args=["retried_by", retry_id])
        return None if winner is None else as_text(winner)

    def release_retry(self, run_id: str, retry_id: str) -> None:
        """The claim given back: the retry could not be queued."""
        self._release_field(keys=[self.keys.run(run_id)], args=["retried_by", retry_id])

    # -- the agent and its supervising executor ------------------------------
    def touch_heartbeat(self, run_id: str) -> None:
        """The agent was heard from, now."""
        self.redis.hset(self.keys.run(run_id), "heartbeat_at", repr(self.clock.now_s()))

    def record_result(self, run_id: str, exit_code: int, artifact_uri: str | None, message: str | None) -> str | None:
        """The agent's result, and a wake-up for the supervising executor: the run's state now, or
        None when the run already has its result (one per run; the first one stands)."""
        extra = [x for k, v in (("artifact_uri", artifact_uri), ("agent_message", message)) if v for x in (k, v)]
        keys = [self.keys.run(run_id), self.keys.result_signal(run_id)]
        if not self._record_result(keys=keys, args=[str(exit_code), repr(self.clock.now_s()), *extra]):
            return None
        return str(as_text(self.redis.hget(keys[0], "state")) or "unknown")

    def wait_result(self, run_id: str, timeout_s: float) -> None:
        """Sleep up to timeout_s (at least 10 ms), waking as soon as the agent's result arrives."""
        # Redis 6.2 (the embedded one) truncates a timeout to whole ms: 0.001 s becomes 0, "block forever".
        self.redis.blpop([self.keys.result_signal(run_id)], timeout=max(MIN_WAIT_S, timeout_s))

    def view(self, run_id: str) -> RunView:
        """What the supervising executor looks at, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(
            self.keys.run(run_id),
            "agent_exit_code",
            "artifact_uri",
            "agent_message",
            "heartbeat_at",
            "disk_error",
            "state",
            "worker_state",
            "step",
        )
        pipe.exists(self.keys.cancel(run_id))
        pipe.exists(self.keys.run_token(run_id))
        (code, uri, message, beat, disk_error, state, worker_state, step), cancel, token = pipe.execute()
        pending = (as_text(step) or "waiting in the scheduler's queue") if as_text(worker_state) == "pending" else None
        return RunView(
            exit_code=None if code is None else int(code),
            artifact_uri=as_text(uri),
            message=as_text(message),
            heartbeat_at=None if beat is None else float(beat),
            cancel_requested=bool(cancel),
            disk_error=as_text(disk_error),
            state=as_text(state),
            pending_step=pending,
            has_token=bool(token),
        )

    # -- the stop flag (a cancel, a wall limit) ------------------------------
    def signal_stop(self, run_id: str) -> None:
        """Tell the run's agent to stop its worker (cancel, wall limit); the state is decided elsewhere."""
        pipe = self.redis.pipeline()
        pipe.set(self.keys.cancel(run_id), "1")
        pipe.publish(self.keys.control(run_id), "cancel")
        pipe.execute()

    def cancel_requested(self, run_id: str) -> bool:
        return bool(self.redis.exists(self.keys.cancel(run_id)))

    def stop_due(self, run_id: str) -> bool:
        """What the agent is told: stop, because a cancel was requested or the run is already over."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.exists(self.keys.cancel(run_id))
        pipe.hget(self.keys.run(run_id), "state")
        requested, state = pipe.execute()
        return bool(requested) or as_text(state) in FINAL_STATES

    async def wait_stop_due(self, run_id: str, wait_s: float, hung_up: Callable[[], Awaitable[bool]]) -> bool:
        """True as soon as stop_due (published or found), False after wait_s or once `hung_up()`."""

        async def due(client: aioredis.Redis) -> bool:
            async with client.pipeline(transaction=False) as pipe:
                pipe.exists(self.keys.cancel(run_id))
                pipe.hget(self.keys.run(run_id), "state")
                requested, state = await pipe.execute()
            return bool(requested) or as_text(state) in FINAL_STATES

        return await wait_published(self.redis, self.keys.control(run_id), due, wait_s, hung_up)
