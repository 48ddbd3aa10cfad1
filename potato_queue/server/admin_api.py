"""The admin JSON API under /admin/training/api (header X-API-Key).

The key is the config's admin_api_key, else $POTATO_ADMIN_API_KEY. There is
no loopback exemption: a request through an agent's forwarded socket is
loopback too, and must not get admin rights (SSH-10).
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from potato_queue.config import LOCAL, ProjectConfig
from potato_queue.runs.finalize import published_predictions, read_jsonl
from potato_queue.runs.submit import RunRefused, start_run, trainer_table
from potato_queue.store import FINAL_STATES, RunStore

__all__ = ["admin_router", "RunRequest", "admin_key"]


class RunRequest(BaseModel):
    trainer: str
    schemas: list[str] = Field(min_length=1)
    backend: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)


class RunAccepted(BaseModel):
    run_id: str
    state: str


def admin_key(config: ProjectConfig) -> str | None:
    return config.admin_api_key or os.environ.get("POTATO_ADMIN_API_KEY") or None


def _require_key(request: Request, x_api_key: str | None = Header(default=None)) -> None:
    expected = admin_key(request.app.state.config)
    if expected is None:
        raise HTTPException(401, "No admin key is configured: set admin_api_key in the config or POTATO_ADMIN_API_KEY")
    if x_api_key is None or not secrets.compare_digest(x_api_key.encode(), expected.encode()):
        raise HTTPException(401, "Admin authentication required: send the header X-API-Key with the project's admin key")


def _store(request: Request) -> RunStore:
    return request.app.state.store


def _get_run(store: RunStore, run_id: str) -> dict[str, Any]:
    try:
        record = store.get(run_id)
    except (KeyError, ValueError):
        raise HTTPException(404, f"No run {run_id!r} in this project") from None
    return _public(record)


def _public(record: dict[str, Any]) -> dict[str, Any]:
    record = dict(record)
    record["ran_on"] = record.pop("backend", None)
    record.pop("job", None)
    return record


def admin_router() -> APIRouter:
    router = APIRouter(dependencies=[Depends(_require_key)], tags=["admin"])

    @router.post("/runs", status_code=202, response_model=RunAccepted)
    def post_run(body: RunRequest, request: Request) -> RunAccepted:
        try:
            record = start_run(request.app.state.config, _store(request), request.app.state.enqueue,
                               trainer=body.trainer, schemas=body.schemas, backend=body.backend, params=body.params)
        except RunRefused as exc:
            raise HTTPException(exc.status, exc.message) from None
        return RunAccepted(run_id=record["run_id"], state="queued")

    @router.get("/runs")
    def list_runs(request: Request, limit: int = 100) -> list[dict[str, Any]]:
        return [_public(r) for r in _store(request).list_runs(limit)]

    @router.get("/runs/{run_id}")
    def get_run(run_id: str, request: Request) -> dict[str, Any]:
        return _get_run(_store(request), run_id)

    @router.post("/runs/{run_id}/cancel", responses={404: {"description": "no such run"},
                                                     409: {"description": "the run had already finished"}})
    def cancel_run(run_id: str, request: Request) -> dict[str, Any]:
        before = _get_run(_store(request), run_id)["state"]
        if before in FINAL_STATES:
            raise HTTPException(409, f"run {run_id} had already finished ({before}); there is nothing to cancel")
        return {"run_id": run_id, "state": _store(request).request_cancel(run_id)}

    @router.get("/runs/{run_id}/events")
    def run_events(run_id: str, request: Request, after: int = 0) -> list[dict[str, Any]]:
        _get_run(_store(request), run_id)
        return list(read_jsonl(_store(request).paths(run_id).events))[after:]

    @router.get("/runs/{run_id}/log", response_class=PlainTextResponse)
    def run_log(run_id: str, request: Request, offset: int = 0) -> str:
        _get_run(_store(request), run_id)
        path = _store(request).paths(run_id).run_log
        if not path.exists():
            return ""
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", errors="replace")

    @router.get("/trainers")
    def trainers() -> dict[str, dict[str, Any]]:
        return trainer_table()

    @router.get("/schemas")
    def schemas(request: Request) -> list[dict[str, Any]]:
        return request.app.state.config.annotation_schemes

    @router.get("/backends")
    def backends(request: Request) -> list[dict[str, Any]]:
        mt = request.app.state.config.model_training
        rows = [{"name": LOCAL, "type": "local", "host": None}]
        rows += [{"name": n, "type": b.type, "host": getattr(b, "host", None)} for n, b in mt.backends.items()]
        return rows

    @router.get("/predictions")
    def predictions(request: Request) -> list[dict[str, Any]]:
        return published_predictions(request.app.state.config)

    return router
