"""The executor's thread that delivers training events to the project's webhooks, as Potato delivers its own.

Each endpoint gets Potato's own sender (potato.webhooks: Standard Webhooks' `webhook-id`,
`webhook-timestamp`, `webhook-signature` headers; its retry schedule, 0 s, 5 s, 30 s, 2 min, 10 min, 1 h;
failed deliveries kept on disk) with a delivery thread of its own, so that an endpoint that hangs delays no
other, and a run never waits on any (the run's move only queued the event: store/webhooks.py). Where Potato
is not installed, `StandardWebhookSender` signs and retries the same way, its retries kept in memory.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import hmac
import json
import logging
import threading
import time
import urllib.request
import uuid
from typing import Any, Protocol

import redis

from potato_queue.clock import REAL_CLOCK
from potato_queue.config import ProjectConfig
from potato_queue.lab.events import Endpoint, endpoints, wants
from potato_queue.store import RunStore
from potato_queue.store.keys import webhook_retry_dir
from potato_queue.store.webhooks import MAX_WAITING

__all__ = ["Sender", "StandardWebhookSender", "sender_for", "deliver_forever", "RETRY_SCHEDULE_S", "sign"]

# Potato's (potato/webhooks/sender.py): the first try, then five retries.
RETRY_SCHEDULE_S = (0, 5, 30, 120, 600, 3600)
WAIT_S = 5.0
_log = logging.getLogger("potato_queue.webhooks")


class Sender(Protocol):
    def emit(self, event_type: str, payload: dict[str, Any]) -> int: ...


def sign(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """Standard Webhooks' signature, as Potato computes it: `v1,` + base64(HMAC-SHA256(id.timestamp.body))."""
    digest = hmac.new(secret.encode(), f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


class StandardWebhookSender:
    """One endpoint's deliveries without Potato: a thread, signed as Potato signs, retried on its schedule."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._due: list[tuple[float, str, bytes, int]] = []  # (when, webhook id, body, attempt)
        self._wake = threading.Condition()
        threading.Thread(target=self._deliver_forever, name=f"webhook-{endpoint.name}", daemon=True).start()

    def emit(self, event_type: str, payload: dict[str, Any]) -> int:
        body = json.dumps(payload, ensure_ascii=False, default=str).encode()
        with self._wake:
            if len(self._due) >= MAX_WAITING:
                return 0  # dropped, as Potato drops past its queue's size: an endpoint down for long
            heapq.heappush(self._due, (time.monotonic(), f"msg_{uuid.uuid4().hex[:24]}", body, 0))
            self._wake.notify()
        return 1

    def _deliver_forever(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(None if not self._due else self._due[0][0] - time.monotonic())
                _, webhook_id, body, attempt = heapq.heappop(self._due)
            if not self._post(webhook_id, body) and attempt + 1 < len(RETRY_SCHEDULE_S):
                with self._wake:
                    due = time.monotonic() + RETRY_SCHEDULE_S[attempt + 1]
                    heapq.heappush(self._due, (due, webhook_id, body, attempt + 1))

    def _post(self, webhook_id: str, body: bytes) -> bool:
        timestamp = int(REAL_CLOCK.now_s())
        headers = {"webhook-id": webhook_id, "webhook-timestamp": str(timestamp), "Content-Type": "application/json"}
        if self.endpoint.secret:
            headers["webhook-signature"] = sign(self.endpoint.secret, webhook_id, timestamp, body)
        request = urllib.request.Request(self.endpoint.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.endpoint.timeout_seconds) as reply:  # noqa: S310
                return 200 <= reply.status < 300
        except Exception as exc:  # noqa: BLE001 - any failure is a failed try (a bad status line, a reset)
            _log.warning("training event to webhook %r failed: %s: %s", self.endpoint.name, type(exc).__name__, exc)
            return False


def sender_for(config: ProjectConfig, endpoint: Endpoint, position: int) -> Sender:
    """Potato's own sender for one endpoint where Potato is installed, else ours."""
    try:
        from potato.webhooks.emitter import WebhookEmitter
    except ImportError:
        return StandardWebhookSender(endpoint)
    # By position too: two endpoints may share a name (Potato's default, `unnamed`).
    folder = webhook_retry_dir(config, f"{position}-{endpoint.name}")
    # 0700: Potato keeps a failed delivery's secret beside it, in its retry database.
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    block = {
        "endpoints": [
            {
                "name": endpoint.name,
                "url": endpoint.url,
                "secret": endpoint.secret,
                "events": list(endpoint.events),
                "timeout_seconds": endpoint.timeout_seconds,
            }
        ]
    }
    # Potato puts its retries in <task_dir>/<output_annotation_dir>/.webhooks: the folder above, absolute.
    return WebhookEmitter(block, {"task_dir": "/", "output_annotation_dir": str(folder)})


def deliver_forever(config: ProjectConfig, store: RunStore) -> None:
    """Hand each queued training event to the senders of the endpoints that want it (the executor's thread)."""
    found = endpoints(config)
    senders = [sender_for(config, endpoint, position) for position, endpoint in enumerate(found)]
    while True:
        try:
            item = store.webhooks.next(WAIT_S)
        except redis.RedisError:
            time.sleep(WAIT_S)  # Redis is away: the events wait in it
            continue
        except (ValueError, KeyError, TypeError) as exc:
            _log.warning("a queued training event could not be read, and was dropped: %s", exc)
            continue
        if item is None:
            continue
        event, payload = item
        for endpoint, sender in zip(found, senders, strict=True):
            if wants(endpoint, event):
                try:
                    sender.emit(event, payload)
                except Exception as exc:  # noqa: BLE001 - one endpoint's failure is not the others'
                    _log.warning(
                        "training event %s for webhook %r: %s: %s", event, endpoint.name, type(exc).__name__, exc
                    )
