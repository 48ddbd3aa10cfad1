"""Connections before they are requests: read deadlines and connection caps, below the ASGI app.

uvicorn arms no timer on a new connection: one that sends nothing, or half a
request header, stays open for good, and 1,100 of them exhausted a server
with systemd's default of 1,024 open files (`/healthz` answered nothing).
Nothing above the HTTP parser sees them, so the server's protocol class does:

- a request's headers must be whole within HEADER_TIMEOUT_S of its first byte
  (or of the connection, for the first request); a body may not pause longer
  than BODY_IDLE_S while we are reading it; otherwise the connection is cut;
- ConnectionGate caps the connections open at once: in all (below the
  process's file limit, with room for Redis, run folders and the rest), and
  per client address, so one client cannot take the whole budget. Loopback
  has no per-client cap: behind the shipped nginx every agent comes from it.
  A connection over a cap is closed at once, before a byte is parsed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import resource
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from potato_queue.settings import BODY_IDLE_S, HEADER_TIMEOUT_S

__all__ = [
    "ConnectionGate",
    "GuardedProtocol",
    "guarded_protocol",
    "raise_file_limit",
    "RESERVED_FILES",
    "LOW_FILE_LIMIT",
]

RESERVED_FILES = 256  # Redis connections, run folders, logs: what the process opens besides connections
LOW_FILE_LIMIT = 4096
PER_CLIENT_MAX = 1024  # a lab of agents behind one NAT address still fits


class ConnectionGate:
    """Open connections counted in all and per client address; admit() says whether one more may open."""

    def __init__(self, max_total: int, max_per_client: int) -> None:
        self.max_total, self.max_per_client = max_total, max_per_client
        self.total = 0
        self.by_client: dict[str, int] = {}
        self.refused = 0  # for /metrics and the tests: connections closed at a cap

    @classmethod
    def for_file_limit(cls, files: int) -> ConnectionGate:
        total = max(16, files - RESERVED_FILES)
        return cls(total, max(8, min(PER_CLIENT_MAX, total // 8)))

    def admit(self, client: str) -> bool:
        held = self.by_client.get(client, 0)
        if self.total >= self.max_total or (held >= self.max_per_client and not _loopback(client)):
            self.refused += 1
            return False
        self.total += 1
        self.by_client[client] = held + 1
        return True

    def release(self, client: str) -> None:
        self.total -= 1
        left = self.by_client.get(client, 1) - 1
        if left > 0:
            self.by_client[client] = left
        else:
            self.by_client.pop(client, None)


def _loopback(client: str) -> bool:
    try:
        return ipaddress.ip_address(client).is_loopback
    except ValueError:
        return True  # a unix socket: this machine


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the gate and the read deadlines; guarded_protocol() gives it its
    settings (uvicorn builds one per connection with its own arguments).

    A request that arrives whole in one read (an idle agent's claim, nearly every request) arms no timer:
    a timer is armed only when a read ends with a request unfinished, and it checks the time the request
    has had when it fires (P7: 10,000 idle agents)."""

    gate: ConnectionGate
    header_timeout_s = HEADER_TIMEOUT_S
    body_idle_s = BODY_IDLE_S
    admitted = False
    client_address = ""
    deadline: asyncio.TimerHandle | None = None
    phase = "headers"  # of the request being read: "headers", "body", or "idle" between requests
    phase_since_s = 0.0  # loop time the phase began (the body's: its last read)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        self.client_address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self.gate.admit(self.client_address):
            transport.abort()
            return
        self.admitted = True
        super().connection_made(transport)
        self.phase_since_s = self.loop.time()
        self._watch(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.admitted:
            return
        self.admitted = False
        self.gate.release(self.client_address)
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.phase == "body":
            self.phase_since_s = self.loop.time()
        super().data_received(data)
        if self.phase == "idle":
            return
        due_s = self.phase_since_s + (self.header_timeout_s if self.phase == "headers" else self.body_idle_s)
        if self.deadline is not None and self.deadline.when() > due_s:
            # the headers' timer, armed for later than a body shorter-lived than them may stall
            self.deadline.cancel()
            self.deadline = None
        if self.deadline is None:
            self._watch(max(0.0, due_s - self.loop.time()))

    def on_message_begin(self) -> None:
        self.phase, self.phase_since_s = "headers", self.loop.time()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self.phase, self.phase_since_s = "body", self.loop.time()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.phase = "idle"
        super().on_message_complete()

    def _watch(self, after_s: float) -> None:
        self.deadline = self.loop.call_later(after_s, self._check)

    def _check(self) -> None:
        """The deadline of the phase being read: cut it when passed, else look again when it will be."""
        self.deadline = None
        if self.phase == "idle" or self.transport is None or self.transport.is_closing():
            return
        limit_s = self.header_timeout_s if self.phase == "headers" else self.body_idle_s
        if self.phase == "body" and self.flow is not None and self.flow.read_paused:
            self.phase_since_s = self.loop.time()  # we stopped reading, not the client
        left_s = self.phase_since_s + limit_s - self.loop.time()
        if left_s > 0:
            self._watch(left_s)
        else:
            self.transport.abort()


def guarded_protocol(
    gate: ConnectionGate, header_timeout_s: float = HEADER_TIMEOUT_S, body_idle_s: float = BODY_IDLE_S
) -> type[asyncio.Protocol]:
    """GuardedProtocol for one server: its gate and deadlines (uvicorn.Config(http=...))."""
    settings = {"gate": gate, "header_timeout_s": header_timeout_s, "body_idle_s": body_idle_s}
    return type("GuardedProtocol", (GuardedProtocol,), settings)


def raise_file_limit(say: Callable[[str], Any]) -> int:
    """Raises this process's soft open-file limit to its hard one; says so when even that is low. The limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft < LOW_FILE_LIMIT:
        gate = ConnectionGate.for_file_limit(soft)
        say(
            f"warning: this process may open only {soft} files (RLIMIT_NOFILE), so it serves at most "
            f"{gate.max_total} connections at once ({gate.max_per_client} per client): a few hundred idle agents "
            "or a connection flood reach that. Raise it: LimitNOFILE=65536 in the unit, or `ulimit -n 65536`"
        )
    return soft
