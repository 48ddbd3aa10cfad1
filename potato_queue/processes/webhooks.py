"""The executor's thread that delivers training events to the project's webhooks, as Potato delivers its own.

Each endpoint gets Potato's own delivery queue (potato.webhooks: Standard Webhooks' `webhook-id`,
`webhook-timestamp`, `webhook-signature` headers; its retry schedule, 0 s, 5 s, 30 s, 2 min, 10 min, 1 h;
failed deliveries kept on disk) with a delivery thread of its own, so that an endpoint that hangs delays no
other, and a run never waits on any (the run's move only queued the event: store/webhooks.py). Where Potato
is not installed, `StandardWebhookSender` signs and retries the same way, its retries kept in memory.

Either way one POST is `post_once`'s, not urllib's: Potato's sender follows a redirect (a 302 turns the
delivery into a GET to wherever the endpoint points) and gives each socket read 10 s, so an endpoint that
trickles its answer holds the delivery as long as it likes. `post_once` follows no redirect (a 3xx is a
failed try) and gives up the whole delivery at the endpoint's `timeout_seconds`.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import hmac
import http.client
import json
import logging
import socket
import ssl
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any, Protocol

import redis

from potato_queue.clock import REAL_CLOCK
from potato_queue.config import ProjectConfig
from potato_queue.lab.events import Endpoint, endpoints, wants
from potato_queue.store import RunStore
from potato_queue.store.keys import webhook_retry_dir
from potato_queue.store.webhooks import MAX_WAITING

__all__ = [
    "Sender",
    "StandardWebhookSender",
    "sender_for",
    "deliver_forever",
    "post_once",
    "RETRY_SCHEDULE_S",
    "MAX_REPLY_BYTES",
    "sign",
]

# Potato's (potato/webhooks/sender.py): the first try, then five retries.
RETRY_SCHEDULE_S = (0, 5, 30, 120, 600, 3600)
WAIT_S = 5.0
MAX_REPLY_BYTES = 64 << 10  # of an endpoint's answer: read (so the connection ends cleanly), never kept
_log = logging.getLogger("potato_queue.webhooks")


class Sender(Protocol):
    def emit(self, event_type: str, payload: dict[str, Any]) -> int: ...


def post_once(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> str | None:
    """POST `body` once: None when the endpoint answered 2xx, else why not. No redirect is followed, and the
    whole delivery (connect, send, the answer) ends at `timeout_s`: a timer shuts the socket at the deadline."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL"
    deadline = threading.Event()
    sockets: list[socket.socket] = []
    timer = threading.Timer(timeout_s, _cut, args=(deadline, sockets))
    timer.start()
    try:
        status = _exchange(parts, body, headers, timeout_s, sockets, deadline)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return f"no answer within {timeout_s:g} s" if deadline.is_set() else f"{type(exc).__name__}: {exc}"
    finally:
        timer.cancel()
        for sock in sockets:
            sock.close()
    if 300 <= status < 400:
        return f"HTTP {status}: a redirect, not followed (deliveries go to the configured URL only)"
    return None if 200 <= status < 300 else f"HTTP {status}"


def _cut(deadline: threading.Event, sockets: list[socket.socket]) -> None:
    deadline.set()
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the read that waits on it
        except OSError:
            pass


def _exchange(
    parts: urllib.parse.SplitResult,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float,
    sockets: list[socket.socket],
    deadline: threading.Event,
) -> int:
    """The request and the answer's status, on a socket the deadline's timer can shut."""
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    raw = socket.create_connection((parts.hostname or "", port), timeout=timeout_s)
    sockets.append(raw)
    if deadline.is_set():
        raise TimeoutError("the deadline passed while connecting")
    kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
    conn = kind(parts.hostname or "", port, timeout=timeout_s)
    conn.sock = raw
    if https:
        # The handshake after the wrapped socket is in the timer's list: wrapping detaches the raw one.
        conn.sock = ssl.create_default_context().wrap_socket(
            raw, server_hostname=parts.hostname, do_handshake_on_connect=False
        )
        sockets.append(conn.sock)
        if deadline.is_set():
            raise TimeoutError("the deadline passed while connecting")
        conn.sock.do_handshake()
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn.request("POST", target, body=body, headers=headers)
    reply = conn.getresponse()
    reply.read(MAX_REPLY_BYTES)
    return reply.status


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
        why = post_once(self.endpoint.url, body, headers, self.endpoint.timeout_seconds)
        if why is not None:
            _log.warning("training event to webhook %r failed: %s", self.endpoint.name, why)
        return why is None


class PotatoQueueSender:
    """One endpoint's deliveries through Potato's delivery queue (its retry database on disk, its schedule),
    each try `post_once`'s."""

    def __init__(self, endpoint: Endpoint, folder: Path) -> None:
        from potato.webhooks.sender import WebhookDeliveryQueue
        from potato.webhooks.signing import build_headers

        timeout_s = endpoint.timeout_seconds

        class BoundedDeliveryQueue(WebhookDeliveryQueue):  # type: ignore[misc]
            def _deliver(self, delivery: dict[str, Any]) -> None:
                # Potato's hook for one try (its retry loop calls it too): its headers, our POST.
                body = delivery["payload_bytes"]
                headers = build_headers(delivery.get("secret") or "", body, webhook_id=delivery["id"])
                why = post_once(delivery["url"], body, headers, timeout_s)
                if why is None:
                    self._remove_retry(delivery["id"])
                else:
                    self._handle_failure(delivery, why)

        self.endpoint = endpoint
        self.queue = BoundedDeliveryQueue(output_dir=str(folder))
        self.queue.start()

    def emit(self, event_type: str, payload: dict[str, Any]) -> int:
        body = json.dumps(payload, ensure_ascii=False, default=str).encode("utf-8")
        return 1 if self.queue.enqueue(url=self.endpoint.url, secret=self.endpoint.secret, payload_bytes=body) else 0


def sender_for(config: ProjectConfig, endpoint: Endpoint, position: int) -> Sender:
    """Potato's delivery queue for one endpoint where Potato is installed, else ours."""
    try:
        import potato.webhooks.sender  # noqa: F401 - whether Potato is here
    except ImportError:
        return StandardWebhookSender(endpoint)
    # By position too: two endpoints may share a name (Potato's default, `unnamed`). Where Potato's own emitter
    # put its retries: <output_annotation_dir>/.webhooks.
    folder = webhook_retry_dir(config, f"{position}-{endpoint.name}")
    # 0700: Potato keeps a failed delivery's secret beside it, in its retry database.
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    (folder / ".webhooks").mkdir(mode=0o700, exist_ok=True)
    return PotatoQueueSender(endpoint, folder / ".webhooks")


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
