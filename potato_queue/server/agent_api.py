"""The agent protocol: what an agent next to the trainer may ask of the server.

Mounted at /api/training/agent/v1 (docs/protocol.md is the contract). Every
call carries a run token, which authorizes exactly one run; nothing here
knows of admin keys, so a request through a forwarded unix socket gets that
run's rights and no more (SSH-10, docs/requirements.md).

401 for every token that does not open the run in the path: none, a wrong
one, an ended run's, and another run's alike (server/guard.py's
token_problem). A token's holder so learns nothing of which runs it opens,
and a refusal costs one Redis GET, not a search of the other runs' tokens.
A token is never echoed in a reply or a log.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from starlette.requests import ClientDisconnect
from starlette.responses import FileResponse

from potato_queue.bounds import clean, clean_flat, too_deep
from potato_queue.config import ProjectConfig
from potato_queue.errors import Conflict, Invalid, NotFound, TooLarge
from potato_queue.runs.ingest import ingest_events
from potato_queue.runs.job import max_predictions_bytes
from potato_queue.server.deps import config_of, refusals, runs_of, store_of
from potato_queue.server.guard import refusal, token_problem
from potato_queue.settings import FREE_MARGIN_BYTES
from potato_queue.store import RunStore
from potato_queue.store.keys import RUN_ID_RE
from potato_queue.store.records import RunFolderError
from potato_queue.wire.job import Job

__all__ = [
    "agent_router",
    "EventBatch",
    "CancelReply",
    "PredictionsReply",
    "ModelReply",
    "ResultIn",
    "ResultReply",
    "MAX_WAIT_S",
]

MAX_WAIT_S = 30.0
TooLargeSaid = Callable[[str], TooLarge]  # the 413 for a body of the size given in words


class EventBatch(BaseModel):
    """Worker events (docs/protocol.md), oldest first; an empty list is a heartbeat."""

    events: list[dict[str, Any]] = Field(default_factory=list)


class CancelReply(BaseModel):
    cancel: bool = Field(description="stop the worker: a cancel was requested or the run is already over")


class PredictionsReply(BaseModel):
    bytes: int
    lines: int


class ModelReply(BaseModel):
    bytes: int = Field(description="what was stored, the manifest line included")


class ResultIn(BaseModel):
    exit_code: int = Field(ge=0, le=255, description="the worker's exit code, shell-style (128 + N for signal N)")
    artifact_uri: str | None = Field(None, max_length=4096, description="<host>:<directory> of the model files")
    message: str | None = Field(None, max_length=8000)


class ResultReply(BaseModel):
    state: str = Field(description="the run's state now")


_AUTH_ERRORS = refusals({401: "no token, or not this run's (wrong, another run's, or the run ended)"})
_NO_WRITES = "the run's folder takes no writes"


# -- auth --------------------------------------------------------------------
# Declared as a security scheme so the OpenAPI document says how to authenticate.
_BEARER = HTTPBearer(
    auto_error=False, scheme_name="run token", description="the run's token, given to the agent on stdin"
)


def authorized_run(
    request: Request,
    run_id: str,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
) -> str:
    """The path's run id once the token is checked (sync: FastAPI runs it in its thread pool)."""
    if request.scope.get("state", {}).get("authorized_run") == run_id:
        return run_id  # the Guard middleware checked it before the body was read
    token = credentials.credentials.strip() if credentials else None
    problem = token_problem(store_of(request), run_id, token or None)
    if problem is not None:
        raise refusal(problem)  # a 401 carries WWW-Authenticate: Bearer (guard.py's handler)
    return run_id


AuthorizedRun = Annotated[str, Depends(authorized_run)]


# -- routes --------------------------------------------------------------------
class Redeemed(BaseModel):
    token: str = Field(description="the run's token: keep it in memory, off command lines and logs")


# Redeem's refusal says no more than a wrong token's does.
CODE_REFUSED = "a valid one-time run code is required (Authorization: Bearer <code>); it is spent by its first use"


def redeem_code(
    request: Request, run_id: str, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]
) -> Redeemed:
    """Trade the run's one-time code (a backend that shows what it is given: ray) for the run's token, once."""
    code = credentials.credentials.strip() if credentials else ""
    token = store_of(request).tokens.redeem(run_id, code) if code and RUN_ID_RE.fullmatch(run_id) else None
    if token is None:
        raise refusal((401, CODE_REFUSED))
    return Redeemed(token=token)


def get_job(request: Request, run_id: AuthorizedRun) -> Job:
    """The job of a started run: trainer, params, limits, the bundle's size and sha256 (wire/job.py's Job,
    as the executor built it)."""
    try:
        job = store_of(request).read(run_id).get("job")
    except KeyError:
        raise NotFound(f"run {run_id} has no record on the server") from None
    if not isinstance(job, dict):
        raise Conflict(f"run {run_id} has not been started: it has no job yet")
    runs_of(request).heard_from(run_id)
    return Job.from_dict(job)


class _BundleFile(FileResponse):
    # Larger reads than Starlette's 64 KiB: a bundle can be hundreds of MB.
    chunk_size = 4 * 1024 * 1024


def get_bundle(request: Request, run_id: AuthorizedRun) -> FileResponse:
    """bundle.tar.gz; `Range: bytes=N-` answers 206 from byte N (to resume)."""
    store = store_of(request)
    path = store.paths(run_id).bundle
    if not path.is_file():
        raise NotFound(f"run {run_id} has no bundle on the server")
    runs_of(request).heard_from(run_id)
    return _BundleFile(path, media_type="application/gzip", filename="bundle.tar.gz")


def post_events(request: Request, run_id: AuthorizedRun, batch: EventBatch) -> CancelReply:
    """Record a batch of events (an empty batch is a heartbeat); the reply says whether to stop."""
    store = store_of(request)
    events = [clean_flat(event) or _checked_event(index, event) for index, event in enumerate(batch.events)]
    try:
        ingest_events(store, run_id, events)
    except OSError as exc:
        raise _cannot_write(store, run_id, exc) from None
    return CancelReply(cancel=store.in_flight.stop_due(run_id))


def _checked_event(index: int, event: dict[str, Any]) -> dict[str, Any]:
    """An event that is not one flat level of plain values: bounded in depth, made servable."""
    problem = too_deep(event, f"event {index} of the batch")
    if problem is not None:
        raise Invalid(problem)
    return clean(event)


def _cannot_write(store: RunStore, run_id: str, exc: OSError) -> RunFolderError:
    """507: the run's folder takes no writes; the executor ends the run with the same error."""
    error = f"the server cannot write run {run_id}'s folder: {exc.strerror or exc}"
    store.pending.note(run_id, error)
    return RunFolderError(error)


async def get_control(
    request: Request,
    run_id: AuthorizedRun,
    wait_s: Annotated[float, Query(ge=0, description=f"how long to wait for a cancel; at most {MAX_WAIT_S:g}")] = 25.0,
) -> CancelReply:
    """Long-poll: answers at once when a cancel is requested, else after wait_s."""
    store, stopping = store_of(request), request.app.state.stopping

    async def nobody_to_answer() -> bool:  # the agent hung up, or the server is stopping: it asks again
        return stopping.is_set() or await request.is_disconnected()

    await run_in_threadpool(runs_of(request).heard_from, run_id)
    return CancelReply(cancel=await store.in_flight.wait_stop_due(run_id, min(wait_s, MAX_WAIT_S), nobody_to_answer))


def _too_large(config: ProjectConfig, size: str) -> TooLarge:
    mb = config.model_training.max_predictions_mb
    return TooLarge(
        f"predictions.jsonl is {size}, above model_training.max_predictions_mb ({mb:g} MB = "
        f"{max_predictions_bytes(config)} bytes); raise max_predictions_mb in the config or predict fewer items",
    )


async def _receive(request: Request, part: Path, limit: int, too_large: TooLargeSaid) -> tuple[int, int]:
    """Stream the body into `part`, refusing one over `limit` bytes: (bytes, lines). The partial file is gone
    on any failure."""
    total = lines = 0
    last = b"\n"
    try:
        # Plain writes: each chunk is small and lands in the page cache, cheaper than a thread hop.
        with open(part, "wb") as fh:
            async for chunk in request.stream():
                total += len(chunk)
                if total > limit:
                    raise too_large(f"more than {limit} bytes")
                if chunk:
                    lines += chunk.count(b"\n")
                    last = chunk[-1:]
                    fh.write(chunk)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return total, lines + (1 if last != b"\n" else 0)


async def _store_upload(
    request: Request, run_id: str, paths: tuple[Path, Path], limit: int, too_large: TooLargeSaid, what: str
) -> tuple[int, int]:
    """The body streamed into paths[0] through paths[1], once: (bytes, lines); 409 when stored already, 413
    over `limit` bytes, 400 when cut off (nothing kept)."""
    store = store_of(request)
    final, part = paths
    await run_in_threadpool(runs_of(request).heard_from, run_id)
    if final.exists():
        raise Conflict(f"run {run_id} already has its {what}; they are stored once")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(f"{int(declared)} bytes")
    try:
        counts = await _receive(request, part, limit, too_large)
        os.replace(part, final)
    except ClientDisconnect:
        raise Invalid(f"the upload was cut off; send the {what} again") from None
    except OSError as exc:
        raise await run_in_threadpool(_cannot_write, store, run_id, exc) from None
    return counts


async def put_predictions(request: Request, run_id: AuthorizedRun) -> PredictionsReply:
    """predictions.jsonl, streamed; 413 over max_predictions_mb, 409 when already stored."""
    store, config = store_of(request), config_of(request)
    paths = store.paths(run_id)
    limit, too_large = max_predictions_bytes(config), partial(_too_large, config)
    where = (paths.predictions, paths.predictions_partial)
    total, lines = await _store_upload(request, run_id, where, limit, too_large, "predictions")
    await run_in_threadpool(store.log, run_id, f"predictions received: {lines} lines, {total} bytes")
    return PredictionsReply(bytes=total, lines=lines)


def _model_too_large(free_bytes: int, size: str) -> TooLarge:
    return TooLarge(
        f"the model files are {size}, more than this server's disk has free ({free_bytes / 1e6:.0f} MB, keeping "
        f"{FREE_MARGIN_BYTES >> 20} MiB free); free space on the server, or lower the backend's max_artifact_mb"
    )


async def put_model(request: Request, run_id: AuthorizedRun) -> ModelReply:
    """The model files of a run whose job asks for them (a ray run's): a JSON line {"manifest": {name: bytes}},
    then an uncompressed tar of those files, stored whole as it came; the executor unpacks it by the rules of
    an ssh copy (executors/untar.py). 409 when already stored or not asked for, 413 over the disk's free space."""
    store = store_of(request)
    job = (await run_in_threadpool(store.read, run_id)).get("job") or {}
    if job.get("send_model_max_bytes") is None:
        raise Conflict(f"run {run_id}'s model files stay where they are: its job does not ask for them")
    paths = store.paths(run_id)
    free = shutil.disk_usage(paths.dir).free - FREE_MARGIN_BYTES
    where = (paths.model_upload, paths.model_upload_partial)
    total, _ = await _store_upload(request, run_id, where, free, partial(_model_too_large, free), "model files")
    await run_in_threadpool(store.log, run_id, f"model files received: {total} bytes")
    return ModelReply(bytes=total)


def post_result(request: Request, run_id: AuthorizedRun, result: ResultIn) -> ResultReply:
    """The agent's last word: the worker's exit code and where the model files are."""
    store = store_of(request)
    state = store.record_result(run_id, result.exit_code, clean(result.artifact_uri), clean(result.message))
    if state is None:
        raise Conflict(f"run {run_id} already has its result; a run has one")
    text = f"agent finished: exit code {result.exit_code}"
    if result.artifact_uri:
        text += f"; model files at {result.artifact_uri}"
    if result.message:
        text += f"; {result.message}"
    store.log(run_id, text)
    return ResultReply(state=state)


def agent_router() -> APIRouter:
    """The agent protocol's routes, to mount at /api/training/agent/v1."""
    router = APIRouter(tags=["agent protocol"], responses=_AUTH_ERRORS)
    router.add_api_route(
        "/runs/{run_id}/job",
        get_job,
        methods=["GET"],
        response_model=Job,
        responses=refusals({404: "no record of the run", 409: "the run has not been started"}),
    )
    router.add_api_route(
        "/runs/{run_id}/bundle",
        get_bundle,
        methods=["GET"],
        response_class=_BundleFile,
        responses={
            200: {"content": {"application/gzip": {}}, "description": "the bundle, tar.gz"},
            206: {"content": {"application/gzip": {}}, "description": "from the Range's first byte"},
            **refusals({404: "the run has no bundle"}),
        },
    )
    router.add_api_route(
        "/runs/{run_id}/events",
        post_events,
        methods=["POST"],
        response_model=CancelReply,
        responses=refusals({400: "an event nests too deep", 413: "a batch over 32 MiB", 507: _NO_WRITES}),
    )
    router.add_api_route("/runs/{run_id}/control", get_control, methods=["GET"], response_model=CancelReply)
    router.add_api_route(
        "/runs/{run_id}/redeem",
        redeem_code,
        methods=["POST"],
        response_model=Redeemed,
        responses=refusals({401: "no code, a wrong or spent one, or the run ended"}),
    )
    _add_uploads(router)
    router.add_api_route(
        "/runs/{run_id}/result",
        post_result,
        methods=["POST"],
        response_model=ResultReply,
        responses=refusals({409: "the run already has its result"}),
    )
    return router


def _add_uploads(router: APIRouter) -> None:
    """The streamed bodies, PUT: predictions.jsonl, and a ray run's model files."""
    uploads = [
        ("predictions", put_predictions, PredictionsReply, "application/x-ndjson", "over max_predictions_mb", ""),
        (
            "model",
            put_model,
            ModelReply,
            "application/octet-stream",
            "over the server's free disk",
            ", or not asked for",
        ),
    ]
    for route, endpoint, reply, media_type, too_large, conflict in uploads:
        router.add_api_route(
            f"/runs/{{run_id}}/{route}",
            endpoint,
            methods=["PUT"],
            response_model=reply,
            openapi_extra={
                "requestBody": {
                    "required": True,
                    "content": {media_type: {"schema": {"type": "string", "format": "binary"}}},
                }
            },
            responses=refusals({409: f"stored already{conflict}", 413: too_large, 507: _NO_WRITES}),
        )
