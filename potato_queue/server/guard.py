"""Before a body is read: who is asking, and how much they may send.

FastAPI reads and parses a request's body before its dependencies run, so a
route's own authentication comes too late: eight unauthenticated 24 MB
POSTs held the event loop for seconds and tripled the server's memory. This
ASGI middleware answers first: 401/403 for a request without the right
admin key, page session or run token, 413 for a body over its route's cap (from
Content-Length, or by reading at most the cap of a chunked body), and only
then lets the route see the request. Predictions and a ray run's model files
are streamed by their route under their own limit (max_predictions_mb, the
disk's free space).

A refusal for a wrong key or token is answered late (the Tarpit): a client
looping on refused requests then costs the server a few requests a second
instead of thousands, which is what kept an admin's poll slow under a flood.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from potato_queue.bounds import clean
from potato_queue.config import ProjectConfig
from potato_queue.errors import Conflict, Denied, Forbidden, Invalid, NotFound, PotatoQueueError, TooLarge
from potato_queue.server.session import cookie_value, cross_site_problem, session_nonce
from potato_queue.store import RunStore
from potato_queue.store.keys import RUN_ID_RE
from potato_queue.store.records import RunFolderError
from potato_queue.store.tokens import TrustedAgentTokens, token_digest

__all__ = [
    "Guard",
    "Tarpit",
    "guard",
    "admin_key",
    "admin_problem",
    "request_admin_problem",
    "request_session",
    "admin_checked",
    "token_problem",
    "backend_problem",
    "bearer",
    "replay",
    "read_at_most",
    "scope_headers",
    "ADMIN_PREFIX",
    "AGENT_PREFIX",
    "PAGE_PREFIX",
    "BODY_CAPS",
    "refusal",
    "http_status_of",
    "STATUS_OF_ERROR",
]

PAGE_PREFIX = "/admin/training"
ADMIN_PREFIX = PAGE_PREFIX + "/api"
AGENT_PREFIX = "/api/training/agent/v1"
KIB = 1024
# Bytes a request body may have, by the part of the API it is for.
BODY_CAPS = {
    "admin": 1024 * KIB,  # a run request: trainer, schemas, params
    "events": 32 * 1024 * KIB,  # a batch of at most 500 events
    "agent": 64 * KIB,  # a result, or no body at all
    "form": 4 * KIB,  # the Training page's sign-in and sign-out
}
# How long a refused authentication waits before its answer, and how many may wait at once (each
# holds one connection and at most uvicorn's 64 KiB read buffer; past that, refusals answer at once).
REFUSAL_DELAY_S = 0.25
MAX_DELAYED_REFUSALS = 64
# The one POST of a run that a run token does not open: it is how a one-time code becomes that token.
REDEEM_ROUTE = "redeem"
UNAUTHORIZED_RUN = "a valid run token is required (Authorization: Bearer <token>)"
SESSION_ENDED = f"the Training page's session has ended (signed out, or Redis lost it): sign in again at {PAGE_PREFIX}"
# Set in a request's scope state once the Guard accepted its admin key or session: the route need not ask again.
ADMIN_CHECKED = "admin_checked"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def admin_key(config: ProjectConfig) -> str | None:
    return config.admin_api_key or config.settings.admin_api_key or None


def admin_problem(config: ProjectConfig, given: str | None) -> tuple[int, str] | None:
    """(status, why) when `given` is not the project's admin key; None when it is."""
    expected = admin_key(config)
    if expected is None:
        return 401, "No admin key is configured: set admin_api_key in the config or POTATO_ADMIN_API_KEY"
    if given is None or not secrets.compare_digest(given.encode(), expected.encode()):
        return 401, "Admin authentication required: send the header X-API-Key with the project's admin key"
    return None


def request_session(store: RunStore, headers: Mapping[str, str]) -> str | None:
    """The nonce of a request's page session: its cookie signed and unexpired, and no X-API-Key beside it
    (whether it is still signed in is Redis's to say: store.sessions.live)."""
    if headers.get("x-api-key") is not None:
        return None
    return session_nonce(admin_key(store.config), cookie_value(headers), store.clock.now_s())


def request_admin_problem(store: RunStore, method: str, headers: Mapping[str, str]) -> tuple[int, str] | None:
    """A request to the admin API: the X-API-Key header, or the Training page's session cookie with its
    cross-site check (403) and still signed in (401; one Redis call); None when it may go on."""
    nonce = request_session(store, headers)
    if nonce is None:
        return admin_problem(store.config, headers.get("x-api-key"))
    problem = cross_site_problem(admin_key(store.config), method, headers, nonce)
    if problem is not None:
        return 403, problem
    return None if store.sessions.live(nonce) else (401, SESSION_ENDED)


def admin_checked(scope: Scope) -> bool:
    """Whether the Guard accepted this request's admin key or session already."""
    return bool(scope.get("state", {}).get(ADMIN_CHECKED))


def token_problem(store: RunStore, run_id: str, token: str | None) -> tuple[int, str] | None:
    """(401, why) unless `token` opens `run_id`. Another run's token is refused like a wrong one: its holder
    learns nothing of which runs it opens, and a refusal costs no search of the other runs' tokens."""
    if token and RUN_ID_RE.fullmatch(run_id) and store.tokens.verify(run_id, token):
        return None
    return 401, UNAUTHORIZED_RUN


def backend_problem(store: RunStore, backend: str, token: str | None) -> tuple[int, str] | None:
    """(status, why) when `token` is not the agent token of `backend`: 403 for another backend's, else 401."""
    if token and store.agents.verify(backend, token):
        return None
    owner = store.agents.owner_of(token) if token else None
    if owner is not None:
        return 403, f"this token is for the agent backend {owner}, not {backend}"
    return 401, (
        f"a valid agent token for backend {backend} is required (Authorization: Bearer <token>): the one "
        f"`potato-queue training register {backend} CONFIG` printed last"
    )


def scope_headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (lower-cased names), or None."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


async def _reply(send: Send, status: int, detail: str, bearer: bool = False) -> None:
    body = json.dumps({"detail": detail}).encode()
    # Connection: close, so the server hangs up rather than reading (and dropping) a body it refused.
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if bearer and status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_at_most(receive: Receive, cap: int) -> list[Message] | None:
    """A body without Content-Length, read while it stays under `cap`; None once it is over."""
    messages, total = [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages
        total += len(message.get("body", b""))
        if total > cap:
            return None
        if not message.get("more_body"):
            return messages


def replay(messages: list[Message], receive: Receive) -> Receive:
    """`receive`, giving `messages` (a body already read) first."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


class Tarpit:
    """Holds refused requests for `delay_s` before they are answered, at most `max_held` at a time.

    The sleep costs no CPU; what a flood of refused requests costs is their rate, and a client that
    waits for its answer (as HTTP clients do) now makes 1/delay_s of them a second.
    """

    def __init__(self, delay_s: float = REFUSAL_DELAY_S, max_held: int = MAX_DELAYED_REFUSALS) -> None:
        self.delay_s, self.max_held, self.held = delay_s, max_held, 0

    async def wait(self) -> None:
        if self.held >= self.max_held:
            return
        self.held += 1
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.held -= 1


class Guard:
    """The middleware: authenticate, then cap, then the route."""

    def __init__(self, app: ASGIApp, store: RunStore, config: ProjectConfig, trust: TrustedAgentTokens) -> None:
        self.app, self.store, self.config = app, store, config
        self.tarpit = Tarpit()
        # Thousands of idle agents share their backend's token: without it, each claim would cost a thread and
        # a Redis call here (P7).
        self.trust = trust

    async def _backend_problem(self, backend: str, token: str | None) -> tuple[int, str] | None:
        digest, now_s = token_digest(token or ""), time.monotonic()
        if token and self.trust.trusted(backend, digest, now_s):
            return None
        problem = await run_in_threadpool(backend_problem, self.store, backend, token)
        if problem is None:
            self.trust.accept(backend, digest, now_s)
        return problem

    def _late_refusals(self, send: Send) -> Send:
        """`send`, holding back a 401/403 that a route gave (the agent GETs check their own token)."""

        async def sent(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] in (401, 403):
                await self.tarpit.wait()
            await send(message)

        return sent

    async def _admin_problem(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str] | None:
        if request_session(self.store, headers) is None:
            problem = request_admin_problem(self.store, scope["method"], headers)  # the key alone: no Redis
        else:
            problem = await run_in_threadpool(request_admin_problem, self.store, scope["method"], headers)
        if problem is None:
            scope.setdefault("state", {})[ADMIN_CHECKED] = True
        return problem

    async def _check(self, scope: Scope, headers: dict[str, str]) -> tuple[tuple[int, str] | None, int | None]:
        """(problem, body cap) of a request; a cap of None means the route streams under its own limit."""
        path = scope["path"]
        if path.startswith(ADMIN_PREFIX + "/"):
            return await self._admin_problem(scope, headers), BODY_CAPS["admin"]
        if path.startswith(PAGE_PREFIX + "/"):
            return None, BODY_CAPS["form"]  # the page's own forms check who signs in, and out
        parts = path[len(AGENT_PREFIX) :].split("/")  # "", "runs", run_id, route
        if len(parts) == 4 and parts[1] == "backends":
            return await self._backend_problem(parts[2], bearer(headers)), BODY_CAPS["agent"]
        if len(parts) != 4 or parts[1] != "runs":
            return None, BODY_CAPS["agent"]
        run_id, route = parts[2], parts[3]
        if scope["method"] in ("GET", "HEAD") or route == REDEEM_ROUTE:
            return None, BODY_CAPS["agent"]  # no body to hold back: the route's own check is soon enough
        problem = await run_in_threadpool(token_problem, self.store, run_id, bearer(headers))
        if problem is None:
            scope.setdefault("state", {})["authorized_run"] = run_id  # the route need not ask Redis again
        return problem, {"events": BODY_CAPS["events"], "predictions": None, "model": None}.get(
            route, BODY_CAPS["agent"]
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith((PAGE_PREFIX + "/", AGENT_PREFIX + "/")):
            return await self.app(scope, receive, send)
        headers = scope_headers(scope)
        problem, cap = await self._check(scope, headers)
        if problem is not None:
            await self.tarpit.wait()
            return await _reply(send, *problem, bearer=scope["path"].startswith(AGENT_PREFIX))
        if scope["method"] in ("GET", "HEAD") and scope["path"].startswith(AGENT_PREFIX + "/"):
            send = self._late_refusals(send)
        if cap is not None:
            declared = headers.get("content-length", "")
            if declared.isdigit() and int(declared) > cap:
                return await _reply(send, 413, f"the body is {int(declared)} bytes, more than this route takes ({cap})")
            if not declared.isdigit() and scope["method"] in ("POST", "PUT", "PATCH"):
                messages = await read_at_most(receive, cap)
                if messages is None:
                    return await _reply(send, 413, f"the body is more than this route takes ({cap} bytes)")
                receive = replay(messages, receive)
        await self.app(scope, receive, send)


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """422 with what was wrong and where, never the input itself: a value like 1e400 or JSON nested
    600 deep cannot be written back, and FastAPI's own handler then answers 500."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    detail = [
        {"loc": [str(part) for part in e.get("loc", ())], "msg": str(e.get("msg")), "type": str(e.get("type"))}
        for e in errors
    ]
    return JSONResponse(status_code=422, content={"detail": clean(detail)})


# The core's refusals as HTTP: the one place a status is chosen for them (the routes raise these, never an
# HTTPException; tests/unit/test_house_rules.py holds it).
STATUS_OF_ERROR: tuple[tuple[type[PotatoQueueError], int], ...] = (
    (NotFound, 404),
    (Conflict, 409),
    (Invalid, 400),
    (Denied, 401),
    (Forbidden, 403),
    (TooLarge, 413),
    (RunFolderError, 507),
)


def http_status_of(exc: PotatoQueueError) -> int:
    return next((status for kind, status in STATUS_OF_ERROR if isinstance(exc, kind)), 400)


def refusal(problem: tuple[int, str]) -> PotatoQueueError:
    """A (status, message) the Guard answers with itself, as the core's error a route raises for it."""
    status, message = problem
    kind = next((kind for kind, known in STATUS_OF_ERROR if known == status), Invalid)
    return kind(message)


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    """A PotatoQueueError from the core: its status, and the message with its fix as the detail."""
    assert isinstance(exc, PotatoQueueError)
    detail = f"{exc.message}; fix: {exc.fix}" if exc.fix else exc.message
    status = http_status_of(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(status_code=status, content={"detail": detail}, headers=headers)


def guard(app: Any, store: RunStore, config: ProjectConfig, trust: TrustedAgentTokens | None = None) -> None:
    """Put the Guard in front of a FastAPI app, a 422 handler that cannot fail to render, and the mapping
    of the core's refusals to HTTP statuses. `trust`: the agent tokens accepted lately (the claims' too)."""
    app.add_middleware(Guard, store=store, config=config, trust=trust or TrustedAgentTokens())
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(PotatoQueueError, _refused)
