"""The training events on their way to the project's webhooks (store.webhooks): queued in Redis by whoever
moves a run (the server, the CLI, an executor), delivered by an executor's thread (processes/webhooks.py).

A queued event is `{event, payload}`: never an endpoint's secret, which the sender reads from the project's
config. Nothing is queued unless an endpoint wants the event, so a project without webhooks costs nothing;
the queue is bounded (an executor that never comes drops the oldest first).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import redis

from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.config import ProjectConfig
from potato_queue.lab.events import endpoints, event_of_state, payload, wants
from potato_queue.store.keys import Keys
from potato_queue.store.records import as_text, epoch_of, utc_now

__all__ = ["TrainingEventOutbox", "MAX_WAITING"]

MAX_WAITING = 10000  # as Potato's own delivery queue
_log = logging.getLogger("potato_queue.webhooks")


class TrainingEventOutbox:
    def __init__(
        self, client: redis.Redis, keys: Keys, config: ProjectConfig, server_url: Any, clock: Clock = REAL_CLOCK
    ) -> None:
        self.redis, self.keys, self.config, self.clock = client, keys, config, clock
        self._server_url = server_url  # () -> the server's public URL or None (store.presence)

    def moved(self, record: Mapping[str, Any]) -> None:
        """The run just moved into its record's state: its event, when one is and an endpoint wants it."""
        event = event_of_state(str(record.get("state")))
        if event is not None:
            self.tell(event, record)

    def tell(self, event: str, record: Mapping[str, Any]) -> None:
        """Queue `event` of `record` for delivery. Whatever fails here (Redis, a webhooks block Potato reads
        differently) loses the event, logged, never the run's move."""
        try:
            self._queue(event, record)
        except Exception as exc:  # noqa: BLE001 - a run's move must not fail for its announcement
            _log.warning(
                "training event %s of run %s not queued: %s: %s", event, record.get("run_id"), type(exc).__name__, exc
            )

    def _queue(self, event: str, record: Mapping[str, Any]) -> None:
        if not any(wants(endpoint, event) for endpoint in endpoints(self.config)):
            return
        started, ended = epoch_of(record.get("started_at")), epoch_of(record.get("finished_at"))
        body = payload(
            event,
            record,
            server_url=self._server_url(),
            now_iso=utc_now(self.clock),
            duration_s=ended - started if started and ended else None,
        )
        pipe = self.redis.pipeline()
        pipe.rpush(self.keys.training_events, json.dumps({"event": event, "payload": body}))
        pipe.ltrim(self.keys.training_events, -MAX_WAITING, -1)  # as Potato drops past its queue's size
        pipe.execute()

    def next(self, timeout_s: float) -> tuple[str, dict[str, Any]] | None:
        """The oldest waiting event, after waiting up to timeout_s for one (None: none came)."""
        got = self.redis.blpop([self.keys.training_events], timeout=timeout_s)
        if got is None:
            return None
        item = json.loads(as_text(got[1]) or "{}")
        return str(item["event"]), dict(item["payload"])

    def waiting(self) -> int:
        return int(self.redis.llen(self.keys.training_events))
