"""create_app(config, redis_url): the admin API, the agent protocol, and the Training page."""

from __future__ import annotations

import threading
from collections.abc import Callable

from fastapi import FastAPI

from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.config import LOCAL, ProjectConfig
from potato_queue.runs.service import RunService
from potato_queue.server.admin_api import admin_router
from potato_queue.server.agent_api import agent_router
from potato_queue.server.claim_door import ClaimDoor
from potato_queue.server.claims import ClaimWakeups, claims_router
from potato_queue.server.guard import ADMIN_PREFIX, AGENT_PREFIX, PAGE_PREFIX, guard
from potato_queue.server.headers import SecurityHeaders
from potato_queue.server.insight_api import insight_router
from potato_queue.server.ops import ops_router
from potato_queue.server.page import page_router
from potato_queue.server.page_api import device_probe, page_api_router
from potato_queue.server.publish_api import publish_router
from potato_queue.server.run_tally import FinishedRuns
from potato_queue.store import RunStore
from potato_queue.store.keys import metrics_tally_path
from potato_queue.store.plumbing import client_for, refresh_forever
from potato_queue.store.tokens import TrustedAgentTokens

__all__ = ["create_app", "ADMIN_PREFIX", "AGENT_PREFIX", "record_server_url"]


def create_app(
    config: ProjectConfig, redis_url: str, *, enqueue: Callable[[str], None], clock: Clock = REAL_CLOCK
) -> FastAPI:
    """The app; `enqueue(run_id)` wakes an executor for a run this server queued (processes/server.py hands in the
    Celery one). `clock`: what the store and the page's sessions and sign-in waits read (tests set it by hand)."""
    app = FastAPI(
        title="potato-queue",
        description="Remote training for Potato annotation projects: the admin API and the agent protocol.",
        version="1",
    )
    client = client_for(redis_url)
    app.state.config = config
    app.state.store = RunStore(config, client, clock)
    # /metrics' tally of the finished runs, kept between scrapes and server starts
    app.state.finished_runs = FinishedRuns(metrics_tally_path(config))
    trust = TrustedAgentTokens()  # the agent tokens Redis accepted lately: the guard's and the claims'
    app.state.claim_wakeups = ClaimWakeups(app.state.store, trust)  # subscribes at the first claim
    guard(app, app.state.store, config, trust)
    # Outermost: an idle agent's claim waits there without the app's routing (P7); added last, it comes first.
    app.add_middleware(ClaimDoor, config=config, wakeups=app.state.claim_wakeups)
    # Outermost of all, so that every answer has them, the Guard's and the ClaimDoor's refusals too.
    app.add_middleware(
        SecurityHeaders,
        unpoliced=[url for url in (app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url) if url],
    )
    app.state.enqueue = enqueue
    app.state.runs = RunService(config, app.state.store, enqueue)
    app.state.redis_url = redis_url
    app.state.stopping = threading.Event()  # set when the server is asked to stop (processes/server.py)
    app.state.local_device = device_probe(lambda: app.state.runs.check(LOCAL))
    app.include_router(admin_router(), prefix=ADMIN_PREFIX)
    app.include_router(page_api_router(), prefix=ADMIN_PREFIX)
    app.include_router(publish_router(), prefix=ADMIN_PREFIX)
    app.include_router(insight_router(), prefix=ADMIN_PREFIX)
    app.include_router(page_router(), prefix=PAGE_PREFIX)
    app.include_router(ops_router())
    app.include_router(agent_router(), prefix=AGENT_PREFIX)
    app.include_router(claims_router(), prefix=AGENT_PREFIX)
    return app


SERVER_URL_TTL_S = 10
SERVER_URL_REFRESH_S = 2.0


def record_server_url(store: RunStore, url: str, local_url: str | None = None) -> None:
    """Where executors and agents started beside this server reach it (no extra flag needed).

    Refreshed every few seconds with a short expiry: it comes back after Redis
    is emptied, and a stopped server's address does not linger.
    """

    refresh_forever(
        lambda: store.presence.record_server_url(url, local_url or url, SERVER_URL_TTL_S),
        SERVER_URL_REFRESH_S,
        "server-url",
    )
