"""An agent backend's agents asking for work: the claim long-poll, and the agent served as one file.

A claim is answered at once when a run is offered to its backend, else it
waits up to wait_s. Waiting costs no Redis connection and no thread: one
subscription per server process (ClaimWakeups) hears the executors' offers
and wakes the claims of that backend, which then race for the run in one Lua
step (tokens.AgentTokens.claim): exactly one gets it. The winner gets a token
for that run alone, and the run's first contact is recorded, so the
executor sees it as in its agent's hands.

Idle agents are cheap (P7): a claim lasts up to MAX_CLAIM_WAIT_S (the agent
asks for 90 s: fewer reconnects), and a claim made while this process knows
nothing is offered to its backend, with a token Redis accepted moments ago,
waits without a thread or a Redis call. It knows because it heard every offer
since its last empty look (an offer is published after it is stored); a
register wakes everyone and forgets the token, and the token is asked about
again at least every AGENT_TOKEN_TRUST_S (which also keeps `training check`'s
last_seen fresh).
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from potato_queue.code_package import agent_zipapp
from potato_queue.config import ProjectConfig
from potato_queue.errors import NotFound
from potato_queue.runs.service import RunService
from potato_queue.server.deps import config_of, refusals, runs_of
from potato_queue.server.guard import bearer
from potato_queue.store import RunStore
from potato_queue.store.tokens import WAKE_EVERYONE, TrustedAgentTokens, token_digest

__all__ = [
    "ClaimWakeups",
    "AgentInfo",
    "Claim",
    "GpuSeen",
    "GpuWaitIn",
    "WaitingAgent",
    "claims_router",
    "agent_backends",
    "MAX_CLAIM_WAIT_S",
    "CLAIM_DEADLINE",
]

MAX_CLAIM_WAIT_S = 100.0
# The scope's state key for a claim that already waited in front of the route (server/claim_door.py): the
# event loop's time at which it ends, instead of now + wait_s.
CLAIM_DEADLINE = "claim_deadline"


class AgentInfo(BaseModel):
    """What an agent says of itself with each claim (`training check` shows the latest)."""

    model_config = ConfigDict(extra="ignore")
    host: str | None = Field(None, max_length=255)
    python: str | None = Field(None, max_length=64, description="the worker interpreter's version")
    executable: str | None = Field(None, max_length=4096, description="the worker's interpreter")
    packages: dict[str, str | None] = Field(
        default_factory=dict, max_length=64, description="trainer packages and their versions"
    )
    agent_python: str | None = Field(None, max_length=64, description="the agent's own Python version")
    pid: int | None = None
    draining: bool = Field(False, description="the agent drains: it finishes its run and claims no new one")
    error: str | None = Field(None, max_length=2000, description="why the worker's interpreter could not be asked")


class GpuSeen(BaseModel):
    """One GPU as nvidia-smi showed it (host/nvidia_smi.py's Gpu)."""

    model_config = ConfigDict(extra="ignore")
    index: int = Field(ge=0, le=4096)
    name: str = Field(max_length=255)
    free_mb: float = Field(ge=0, le=1e9, allow_inf_nan=False)
    total_mb: float = Field(ge=0, le=1e9, allow_inf_nan=False)
    utilization_pct: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    compute_cap: str | None = Field(None, max_length=16)


class GpuWaitIn(BaseModel):
    """What an agent waits for before it claims (host/gpus.py's GpuWait): min_free_mb on a GPU; the closest."""

    model_config = ConfigDict(extra="ignore")
    min_free_mb: float = Field(gt=0, le=1e9, allow_inf_nan=False)
    best: GpuSeen | None = None


class WaitingAgent(AgentInfo):
    """An agent that waits for a free GPU (--min-free-gpu-mb) before it claims, and what it waits for."""

    gpu_wait: GpuWaitIn


class Claim(BaseModel):
    """The run this agent now has (null when none came within wait_s), and a token for that run alone."""

    run_id: str | None = None
    token: str | None = None
    drain: bool = Field(False, description="claim no more: the backend's drain switch is on (or the agent drains)")


def agent_backends(config: ProjectConfig) -> list[str]:
    # `local` is never an agent backend (and building its config model costs each claim a pydantic model).
    return [name for name, backend in config.model_training.backends.items() if backend.type == "agent"]


def _require_agent_backend(config: ProjectConfig, backend: str) -> None:
    if backend not in agent_backends(config):
        raise NotFound(
            f"{backend!r} is not an agent backend of this project (agent backends: "
            f"{', '.join(agent_backends(config)) or 'none'})"
        )


class ClaimWakeups:
    """One pub/sub subscription per server process, and the claims waiting in it, by backend.

    An offer wakes one waiting claim (the one waiting longest), not all: with
    thousands of idle agents, waking them all for one run would cost thousands
    of claim tries. A new token (a register) wakes them all, so claims made
    with the old one are refused at once.
    """

    def __init__(self, store: RunStore, trust: TrustedAgentTokens | None = None) -> None:
        self.store = store
        self.trust = trust or TrustedAgentTokens()  # the guard's, in the app
        self._waiting: dict[str, dict[int, asyncio.Future[None]]] = {}
        self._next_id = 0
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None
        self._heard: dict[str, int] = {}  # offers heard per backend (a counter)
        self._none_offered: set[str] = set()  # backends whose last look found nothing, no offer heard since
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False  # the server is stopping: every claim answers "nothing" now

    async def _listen(self, ready: asyncio.Event) -> None:
        async for data in self.store.offers.announcements(ready.set):
            everyone = data.startswith(WAKE_EVERYONE)
            self.wake(data[len(WAKE_EVERYONE) :] if everyone else data, everyone=everyone)

    async def _started(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._none_offered.clear()  # offers made while nobody listened were not heard
            self._ready = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._listen(self._ready))
        assert self._ready is not None
        await self._ready.wait()

    async def waiter(self, backend: str) -> tuple[int, asyncio.Future[None]]:
        """A place in the backend's line: take it before looking, so no offer slips between."""
        await self._started()
        self._next_id += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(backend, {})[self._next_id] = future
        return self._next_id, future

    def stop(self) -> None:
        """The server is stopping (from its signal handler): every waiting claim answers "nothing" now, so the
        shutdown does not wait out (and then cancel, with an ERROR) the agents' long-polls."""
        self.stopping = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for line in self._waiting.values():
            for future in line.values():
                if not future.done():
                    future.set_result(None)

    def leave(self, backend: str, place: int) -> None:
        self._waiting.get(backend, {}).pop(place, None)

    def heard(self, backend: str) -> int:
        """How many offers for `backend` this process has heard: the mark a look starts from."""
        return self._heard.get(backend, 0)

    def nothing_offered(self, backend: str, digest: str, now_s: float) -> bool:
        """Whether a claim may wait without looking: nothing offered, and the token accepted moments ago."""
        return backend in self._none_offered and self.trust.trusted(backend, digest, now_s)

    def looked(self, backend: str, digest: str, heard: int, empty: bool, now_s: float) -> None:
        """A claim asked Redis: the token was accepted; nothing offered, unless an offer was heard meanwhile."""
        self.trust.accept(backend, digest, now_s)
        if empty and self._heard.get(backend, 0) == heard:
            self._none_offered.add(backend)
        else:
            self._none_offered.discard(backend)

    def wake(self, backend: str, everyone: bool = False) -> None:
        self._heard[backend] = self._heard.get(backend, 0) + 1
        self._none_offered.discard(backend)
        if everyone:
            self.trust.forget(backend)  # a register: the old token must be refused at once
        line = self._waiting.get(backend, {})
        while line:
            future = line.pop(next(iter(line)))
            if not future.done():
                future.set_result(None)
                if not everyone:
                    return


def _wakeups(request: Request) -> ClaimWakeups:
    return request.app.state.claim_wakeups


def _claim_once(runs: RunService, backend: str, token: str, agent: dict[str, Any]) -> Claim | None:
    """One try: the claim, None when nothing is offered (Denied, 401, when the token is no longer this
    backend's)."""
    claimed = runs.claimed(backend, token, agent)
    if claimed is None:
        return None
    return Claim(drain=True) if claimed.drain else Claim(run_id=claimed.run_id, token=claimed.token)


async def claim(
    request: Request,
    backend: str,
    agent: AgentInfo,
    wait_s: Annotated[
        float, Query(ge=0, description=f"how long to wait for a run; at most {MAX_CLAIM_WAIT_S:g}")
    ] = 25.0,
) -> Claim:
    """Long-poll for a run of this agent backend (backend token): answers as soon as one is offered."""
    _require_agent_backend(config_of(request), backend)
    wakeups, token, info = _wakeups(request), bearer(request.headers) or "", agent.model_dump()
    loop = asyncio.get_running_loop()
    deadline = request.scope.get("state", {}).get(CLAIM_DEADLINE) or loop.time() + min(wait_s, MAX_CLAIM_WAIT_S)
    digest = token_digest(token)
    while True:
        place, offered = await wakeups.waiter(backend)
        found = None
        if not wakeups.nothing_offered(backend, digest, time.monotonic()):
            heard = wakeups.heard(backend)
            try:
                found = await run_in_threadpool(_claim_once, runs_of(request), backend, token, info)
            except BaseException:
                wakeups.leave(backend, place)
                raise
            wakeups.looked(backend, digest, heard, found is None, time.monotonic())
        if found is not None or wakeups.stopping:
            wakeups.leave(backend, place)
            return found or Claim()
        try:
            await asyncio.wait_for(offered, max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            wakeups.leave(backend, place)
            return Claim()
        if wakeups.stopping:
            wakeups.leave(backend, place)
            return Claim()
        if await request.is_disconnected():
            wakeups.wake(backend)  # nobody here to hand the run to: the next agent in line takes it
            return Claim()


def waiting(request: Request, backend: str, agent: WaitingAgent) -> dict[str, Any]:
    """An agent of this backend (backend token) waits for a GPU with room before it claims: the runs offered
    to the backend show it on their step line (said again every 15 s; older word counts for nothing)."""
    _require_agent_backend(config_of(request), backend)
    info = agent.model_dump(exclude={"gpu_wait"})
    runs_of(request).agent_waits(backend, bearer(request.headers) or "", info, agent.gpu_wait.model_dump())
    return {}


def get_agent_zipapp() -> Response:
    """The agent, worker and trainers as one file: `python3 agent.pyz --server URL --backend NAME`."""
    package = agent_zipapp()
    return Response(
        package.data,
        media_type="application/zip",
        headers={
            "Content-Disposition": 'attachment; filename="agent.pyz"',
            "ETag": f'"{package.sha256}"',
            "X-Content-SHA256": package.sha256,
        },
    )


# What a backend-level agent route answers before it looks at the request (OpenAPI's documented replies).
_BACKEND_REFUSALS = {401: "no token, or not this backend's (wrong, or replaced)", 404: "no agent backend of that name"}


def claims_router() -> APIRouter:
    """The backend-level agent routes, to mount at /api/training/agent/v1 beside the per-run ones."""
    router = APIRouter(tags=["agent protocol"])
    router.add_api_route(
        "/backends/{backend}/claim",
        claim,
        methods=["POST"],
        response_model=Claim,
        responses=refusals(
            {**_BACKEND_REFUSALS, 403: "the token belongs to another backend", 413: "a body over 64 KiB"}
        ),
    )
    router.add_api_route(
        "/backends/{backend}/waiting", waiting, methods=["POST"], responses=refusals(_BACKEND_REFUSALS)
    )
    router.add_api_route(
        "/agent.pyz",
        get_agent_zipapp,
        methods=["GET"],
        response_class=Response,
        responses={200: {"content": {"application/zip": {}}, "description": "a zipapp; needs Python 3.8+"}},
    )
    return router
