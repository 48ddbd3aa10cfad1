"""ClaimDoor: an idle agent's claim waits here, in front of the app, without FastAPI.

With thousands of idle agents, almost every claim is the same request: a
token accepted moments ago, nothing offered to its backend, so the claim
only waits. Through FastAPI each cost about 1.5 ms of CPU (middleware,
routing, dependency injection, validation, serialization: P7's profile), at
10,000 agents most of the server's idle CPU. The door answers exactly that
case itself: it validates the body with the route's own model, takes a place
in ClaimWakeups' line, and waits. When an offer wakes it, the request goes
on to the claim route with its remaining deadline, so the claim itself (the
race for the run, a refused token, a disconnect) has one home. Anything else
(an unknown backend, a token not trusted yet, a bad body or wait_s, a
chunked body) goes on untouched, to the Guard and the route, which answer it
as before.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from urllib.parse import parse_qs

from pydantic import ValidationError
from starlette.requests import Request

from potato_queue.config import ProjectConfig
from potato_queue.server.claims import (
    CLAIM_DEADLINE,
    MAX_CLAIM_WAIT_S,
    AgentInfo,
    ClaimWakeups,
    agent_backends,
)
from potato_queue.server.guard import (
    AGENT_PREFIX,
    BODY_CAPS,
    ASGIApp,
    Receive,
    Scope,
    Send,
    bearer,
    read_at_most,
    replay,
    scope_headers,
)
from potato_queue.store.tokens import token_digest

__all__ = ["ClaimDoor"]

_CLAIM_PATH = (AGENT_PREFIX + "/backends/", "/claim")
_NOTHING = json.dumps({"run_id": None, "token": None, "drain": False}, separators=(",", ":")).encode()


def _claimed_backend(scope: Scope) -> str | None:
    """The backend of a `POST .../backends/{backend}/claim`, else None."""
    if scope["type"] != "http" or scope["method"] != "POST":  # lifespan events have no path
        return None
    path = scope["path"]
    if not path.startswith(_CLAIM_PATH[0]):
        return None
    backend, _, rest = path[len(_CLAIM_PATH[0]) :].partition("/")
    return backend if "/" + rest == _CLAIM_PATH[1] and backend else None


def _wait_s(scope: Scope) -> float | None:
    """The claim's wait_s (the route's default, 25, when absent); None when the route must judge it."""
    given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("wait_s", ["25"])[-1]
    try:
        wait_s = float(given)
    except ValueError:
        return None
    return min(wait_s, MAX_CLAIM_WAIT_S) if math.isfinite(wait_s) and wait_s >= 0 else None


class ClaimDoor:
    """The middleware: an idle claim waits here; everything else goes on."""

    def __init__(self, app: ASGIApp, config: ProjectConfig, wakeups: ClaimWakeups) -> None:
        self.app, self.wakeups = app, wakeups
        self.backends = frozenset(agent_backends(config))

    def _digest(self, scope: Scope, backend: str) -> str | None:
        """The token's digest when this claim would only wait (a trusted token, nothing offered, a body
        under the cap); else None."""
        headers = scope_headers(scope)
        declared = headers.get("content-length", "")
        if not declared.isdigit() or int(declared) > BODY_CAPS["agent"]:
            return None
        token = bearer(headers)
        digest = token_digest(token) if token else None
        return digest if digest and self.wakeups.nothing_offered(backend, digest, time.monotonic()) else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        backend = _claimed_backend(scope)
        wait_s = _wait_s(scope) if backend in self.backends else None
        digest = self._digest(scope, backend) if backend is not None and wait_s is not None else None
        if backend is None or wait_s is None or digest is None:
            return await self.app(scope, receive, send)
        messages = await read_at_most(receive, BODY_CAPS["agent"])  # not over it: Content-Length said so
        if messages is None or messages[-1]["type"] != "http.request":
            return  # the agent left before its claim was read: nothing to answer
        try:
            info = AgentInfo.model_validate_json(b"".join(m.get("body", b"") for m in messages))
        except ValidationError:
            return await self.app(scope, replay(messages, receive), send)  # the route says what was wrong
        if info.draining:  # an agent's word that it drains waits for nothing: the route keeps it
            return await self.app(scope, replay(messages, receive), send)
        if await self._waited(backend, digest, wait_s, scope, receive, send):
            await self.app(scope, replay(messages, receive), send)

    async def _waited(
        self, backend: str, digest: str, wait_s: float, scope: Scope, receive: Receive, send: Send
    ) -> bool:
        """Wait for an offer: True when the route should now look (with the deadline left in the scope)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        scope.setdefault("state", {})[CLAIM_DEADLINE] = deadline
        place, offered = await self.wakeups.waiter(backend)
        if self.wakeups.stopping:
            self.wakeups.leave(backend, place)
            await _nothing(send)
            return False
        if not self.wakeups.nothing_offered(backend, digest, time.monotonic()):
            self.wakeups.leave(backend, place)  # an offer came while the place was taken: the route looks
            return True
        try:
            await asyncio.wait_for(offered, max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            self.wakeups.leave(backend, place)
            await _nothing(send)
            return False
        if self.wakeups.stopping:
            self.wakeups.leave(backend, place)
            await _nothing(send)
            return False
        if await Request(scope, receive).is_disconnected():
            self.wakeups.wake(backend)  # nobody here to hand the run to: the next agent in line takes it
            return False
        return True


async def _nothing(send: Send) -> None:
    """The route's answer when no run came within wait_s: 200, a Claim of nulls."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(_NOTHING)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": _NOTHING})
