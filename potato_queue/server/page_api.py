"""The JSON routes the Training page needs beyond the admin API's: a backend's check, the live runs, a run's
predictions file. Under /admin/training/api like the rest, so the Guard authenticates them (the X-API-Key
header, or the page's session cookie).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from potato_queue.errors import NotFound
from potato_queue.executors.base import CheckReport
from potato_queue.server.admin_api import admin_routes
from potato_queue.server.deps import refusals, runs_of, store_of
from potato_queue.server.guard import request_session
from potato_queue.store.potato_compat import ledger_status

__all__ = ["page_api_router", "device_probe", "STREAM_TICK_S"]

STREAM_TICK_S = 0.5
KEEPALIVE_S = 15.0
LISTED = 50


def check_backend(name: str, request: Request) -> dict[str, Any]:
    """The backend's check as `training check` reports it (RunService.check). A plain def: FastAPI runs it in
    its thread pool, so a host slow to answer over ssh holds this request only."""
    report = runs_of(request).check(name)
    return {
        "backend": name,
        "ok": report.ok,
        "lines": [*report.lines, ledger_status(request.app.state.config).line()],
        "drain_switched": report.data.get("drain_switched"),
    }


def device_probe(check: Callable[[], CheckReport]) -> Callable[[float], str | None]:
    """The device a local run would use (for the menu's `local (this machine, <device>)`), asked once, by
    `check` (the local backend's: it asks the worker's code in a process of its own, so the server never
    imports torch), at the first call; the returned function waits up to its timeout for the answer."""
    found: list[str] = []
    done, lock = threading.Event(), threading.Lock()
    started: list[threading.Thread] = []

    def ask() -> None:
        try:
            found.append(str(check().data.get("device") or "device unknown"))
        except Exception:  # noqa: BLE001 - the menu's decoration: it must not fail the backends list
            found.append("device unknown")
        finally:
            done.set()

    def wait(timeout_s: float) -> str | None:
        with lock:
            if not started:
                started.append(threading.Thread(target=ask, name="local-device", daemon=True))
                started[0].start()
        done.wait(timeout_s)
        return found[0] if found else None

    return wait


def _snapshot(request: Request, session: str | None) -> str | None:
    """The runs table as JSON; None once the page's session has been signed out."""
    if session is not None and not store_of(request).sessions.live(session):
        return None
    return json.dumps(runs_of(request).listed(LISTED), default=str)


async def _runs_events(request: Request) -> AsyncIterator[str]:
    """Server-sent events: the runs table whenever it changes (and a comment now and then, to keep proxies
    from closing an idle stream). A browser's EventSource reconnects by itself after a restart. A stream
    opened with the page's cookie ends at its sign-out: it outlives the request that checked the cookie."""
    last, quiet_s = "", 0.0
    yield "retry: 1000\n\n"
    stopping, session = request.app.state.stopping, request_session(store_of(request), request.headers)
    while not stopping.is_set() and not await request.is_disconnected():
        snapshot = await run_in_threadpool(_snapshot, request, session)
        if snapshot is None:
            return
        if snapshot != last:
            last, quiet_s = snapshot, 0.0
            yield f"event: runs\ndata: {snapshot}\n\n"
        elif quiet_s >= KEEPALIVE_S:
            quiet_s = 0.0
            yield ": keep-alive\n\n"
        await asyncio.sleep(STREAM_TICK_S)
        quiet_s += STREAM_TICK_S


def runs_stream(request: Request) -> StreamingResponse:
    return StreamingResponse(
        _runs_events(request),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def predictions_file(run_id: str, request: Request) -> FileResponse:
    """The run's predictions.jsonl, as a download."""
    runs_of(request).record(run_id)
    path = store_of(request).paths(run_id).predictions
    if not path.exists():
        raise NotFound(f"run {run_id} has no predictions")
    return FileResponse(path, media_type="application/x-ndjson", filename=f"{run_id}-predictions.jsonl")


def page_api_router() -> APIRouter:
    router = admin_routes("page")
    router.add_api_route(
        "/backends/{name}/check",
        check_backend,
        methods=["GET"],
        responses=refusals({404: "no backend of that name"}),
    )
    # An endless event stream: for the page, not for API clients (nor for a fuzzer reading the OpenAPI document).
    router.add_api_route("/stream", runs_stream, methods=["GET"], include_in_schema=False)
    router.add_api_route(
        "/runs/{run_id}/predictions.jsonl",
        predictions_file,
        methods=["GET"],
        response_class=FileResponse,
        responses=refusals({404: "no such run, or it has no predictions"}),
    )
    return router
