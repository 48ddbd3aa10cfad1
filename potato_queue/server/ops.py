"""/metrics (Prometheus' text format) and /healthz, for whoever runs potato-queue as a service.

/metrics answers the admin key (X-API-Key) or, for a scraper, the token in
$POTATO_QUEUE_METRICS_TOKEN as `Authorization: Bearer <token>` (a token that
opens nothing else). /healthz needs nothing and tells nothing private: Redis
answers, and how many executors said they are up in the last few seconds.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import redis
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from potato_queue.run import FINAL_STATES, STATES, RunState
from potato_queue.server.guard import admin_problem, bearer
from potato_queue.server.run_tally import RunTally
from potato_queue.settings import REDIS_URL_ENV

__all__ = ["ops_router", "render_metrics", "render_tally"]

# /healthz answers anyone: it names the problem and where to look, never Redis's address or password (the
# client's error text has them).
REDIS_DOWN = (
    f"Redis does not answer: start it, or restart the server with one that runs (--redis-url, or {REDIS_URL_ENV})"
)


def _scrape_allowed(request: Request) -> bool:
    token = request.app.state.config.settings.metrics_token
    given = bearer({k.lower(): v for k, v in request.headers.items()})
    if token and given and secrets.compare_digest(given.encode(), token.encode()):
        return True
    return admin_problem(request.app.state.config, request.headers.get("x-api-key")) is None


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _metric(
    lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[dict[str, Any], float]]
) -> None:
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{inner}}} {value:g}" if inner else f"{name} {value:g}")


def render_metrics(
    runs: list[dict[str, Any]], queue_length: int, agents: dict[str, float | None], executors: int, now_s: float
) -> str:
    """The exposition text of these runs (every run of the project): RunTally, then render_tally."""
    live = [r for r in runs if r.get("state") not in FINAL_STATES]
    return render_tally(RunTally().plus(runs), live, queue_length, agents, executors, now_s)


def render_tally(
    tally: RunTally,
    live: list[Mapping[str, Any]],
    queue_length: int,
    agents: dict[str, float | None],
    executors: int,
    now_s: float,
) -> str:
    """The exposition text: runs by state and backend, the queue, run durations, heartbeat ages, agents."""
    lines: list[str] = []
    by = tally.states
    backends = sorted({b for _, b in by} | {"local"})
    _metric(
        lines,
        "potato_queue_runs",
        "gauge",
        "Runs in the project by state and backend.",
        [
            ({"state": s, "backend": b}, by.get((s, b), 0))
            for s in (*STATES, RunState.BROKEN)
            for b in backends
            if by.get((s, b), 0) or s in STATES
        ],
    )
    _metric(
        lines, "potato_queue_queue_length", "gauge", "Runs waiting in the queue for an executor.", [({}, queue_length)]
    )
    _metric(lines, "potato_queue_executors", "gauge", "Executor processes that said they are up.", [({}, executors)])
    _totals(lines, tally)
    beats = [
        ({"run_id": r["run_id"], "backend": r.get("backend")}, now_s - float(r["heartbeat_at"]))
        for r in live
        if r.get("heartbeat_at")
    ]
    _metric(lines, "potato_queue_heartbeat_age_seconds", "gauge", "Seconds since a run's agent last reported.", beats)
    _metric(
        lines,
        "potato_queue_agent_last_seen_age_seconds",
        "gauge",
        "Seconds since an agent backend's agent last asked for work.",
        [({"backend": b}, now_s - seen) for b, seen in sorted(agents.items()) if seen is not None],
    )
    return "\n".join(lines) + "\n"


def _totals(lines: list[str], tally: RunTally) -> None:
    """Finished runs' wall time, and GPU use, by backend."""
    lines += [
        "# HELP potato_queue_run_duration_seconds Wall time of finished runs, from start to end.",
        "# TYPE potato_queue_run_duration_seconds summary",
    ]
    for backend in sorted(b for b, n in tally.finished.items() if n):
        lines.append(
            f'potato_queue_run_duration_seconds_sum{{backend="{_label(backend)}"}} {tally.durations_s[backend]:g}'
        )
        lines.append(
            f'potato_queue_run_duration_seconds_count{{backend="{_label(backend)}"}} {tally.finished[backend]}'
        )
    for name, totals, help_text in (
        (
            "potato_queue_gpu_hours",
            tally.gpu_hours,
            "GPU-hours the project's runs used, by backend (sampled by the agent).",
        ),
        ("potato_queue_gpu_energy_kwh", tally.kwh, "Energy the project's runs' GPUs drew, in kWh, by backend."),
    ):
        _metric(lines, name, "gauge", help_text, [({"backend": b}, totals[b]) for b in sorted(totals)])


def metrics(request: Request) -> PlainTextResponse:
    if not _scrape_allowed(request):
        return PlainTextResponse(
            "the admin key (X-API-Key) or the scrape token ($POTATO_QUEUE_METRICS_TOKEN, as "
            "Authorization: Bearer) is required\n",
            status_code=401,
        )
    store, config = request.app.state.store, request.app.state.config
    agents = {}
    for name, backend in config.model_training.backends.items():
        if backend.type == "agent":
            registration = store.agents.registration(name)
            agents[name] = registration["last_seen"] if registration else None
    tally, live = request.app.state.finished_runs.scrape(store)
    text = render_tally(
        tally,
        live,
        store.presence.queue_length(),
        agents,
        len(store.presence.executors_seen()),
        store.clock.now_s(),
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


def healthz(request: Request) -> JSONResponse:
    """200 when Redis answers and an executor is up; 503 saying which is not."""
    store = request.app.state.store
    try:
        store.presence.ping()
        executors = len(store.presence.executors_seen())
    except redis.RedisError:
        return JSONResponse(
            {"ok": False, "redis": "does not answer", "executors": None, "problem": REDIS_DOWN}, status_code=503
        )
    problem = None if executors else "no executor is up: start one (potato-queue executor CONFIG)"
    body = {"ok": problem is None, "redis": "ok", "executors": executors, **({"problem": problem} if problem else {})}
    return JSONResponse(body, status_code=200 if problem is None else 503)


def ops_router() -> APIRouter:
    router = APIRouter(tags=["operations"])
    router.add_api_route(
        "/metrics",
        metrics,
        methods=["GET"],
        response_class=PlainTextResponse,
        responses={401: {"description": "neither the admin key nor the scrape token"}},
    )
    # A probe for load balancers and systemd, not part of the API (its 503 is its message).
    router.add_api_route("/healthz", healthz, methods=["GET"], include_in_schema=False)
    return router
