"""The JSON routes the Training page needs beyond the admin API's: a backend's check, the live runs, a run's
predictions file. Under /admin/training/api like the rest, so the Guard authenticates them (the X-API-Key
header, or the page's session cookie).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from potato_queue.errors import NotFound
from potato_queue.server.admin_api import require_admin_key
from potato_queue.server.deps import ErrorReply, runs_of, store_of
from potato_queue.server.guard import request_session

__all__ = ["page_api_router", "device_probe", "STREAM_TICK_S", "CHECK_TIMEOUT_S"]

STREAM_TICK_S = 0.5
KEEPALIVE_S = 15.0
CHECK_TIMEOUT_S = 180
LISTED = 50


def check_backend(name: str, request: Request) -> dict[str, Any]:
    """`potato-queue training check NAME CONFIG` in a process of its own, as an admin would run it: the
    same report, and the server neither blocks on ssh nor imports torch for the local device."""
    config = request.app.state.config
    runs_of(request).backend_known(name)
    try:
        done = subprocess.run(_check_argv(config, name, request.app.state.redis_url), capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL,
                              env=dict(os.environ))
    except subprocess.TimeoutExpired:
        return {"backend": name, "ok": False, "lines": [f"the check of {name} took longer than {CHECK_TIMEOUT_S} s"]}
    lines = done.stdout.splitlines() + [line for line in done.stderr.splitlines() if not line.startswith("warning:")]
    return {"backend": name, "ok": done.returncode == 0, "lines": lines}


def _check_argv(config: Any, name: str, redis_url: str) -> list[str]:
    return [sys.executable, "-m", "potato_queue.cli", "training", "check", name, str(config.config_path),
            "--redis-url", redis_url]


def device_probe(config: Any, redis_url: str) -> Callable[[float], str | None]:
    """The device a local run would use (for the menu's `local (this machine, <device>)`), asked once, by the
    local check, at the first call; the returned function waits up to its timeout for the answer."""
    found: list[str] = []
    done, lock = threading.Event(), threading.Lock()
    started: list[threading.Thread] = []

    def ask() -> None:
        try:
            out = subprocess.run([*_check_argv(config, "local", redis_url), "--json"], capture_output=True,
                                 text=True, timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL)
            found.append(str(json.loads(out.stdout).get("device") or "device unknown"))
        except (OSError, ValueError, subprocess.SubprocessError):
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
    return StreamingResponse(_runs_events(request), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def predictions_file(run_id: str, request: Request) -> FileResponse:
    """The run's predictions.jsonl, as a download."""
    runs_of(request).record(run_id)
    path = store_of(request).paths(run_id).predictions
    if not path.exists():
        raise NotFound(f"run {run_id} has no predictions")
    return FileResponse(path, media_type="application/x-ndjson", filename=f"{run_id}-predictions.jsonl")


def page_api_router() -> APIRouter:
    router = APIRouter(dependencies=[Depends(require_admin_key)], tags=["page"],
                       responses={401: {"model": ErrorReply, "description": "no admin key or session, or a wrong one"},
                                  403: {"model": ErrorReply, "description": "a cross-site request (the session cookie "
                                                                            "without the page's token)"}})
    router.add_api_route("/backends/{name}/check", check_backend, methods=["GET"], responses={
        404: {"model": ErrorReply, "description": "no backend of that name"}})
    # An endless event stream: for the page, not for API clients (nor for a fuzzer reading the OpenAPI document).
    router.add_api_route("/stream", runs_stream, methods=["GET"], include_in_schema=False)
    router.add_api_route("/runs/{run_id}/predictions.jsonl", predictions_file, methods=["GET"], response_class=FileResponse,
                         responses={404: {"model": ErrorReply, "description": "no such run, or it has no predictions"}})
    return router
