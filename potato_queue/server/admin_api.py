"""The admin JSON API under /admin/training/api (header X-API-Key).

The key is the config's admin_api_key, else $POTATO_ADMIN_API_KEY. There is
no loopback exemption: a request through an agent's forwarded socket is
loopback too, and must not get admin rights (SSH-10). Every status a route
answers is in the OpenAPI document.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, Field

from potato_queue.bundle import project_modality, schema_kind
from potato_queue.config import LOCAL
from potato_queue.run import RunState
from potato_queue.runs.finalize import published_predictions
from potato_queue.runs.submit import trainer_table
from potato_queue.schemes import refusal as type_refusal
from potato_queue.server.deps import Responses, refusals, runs_of, store_of
from potato_queue.server.guard import admin_checked, refusal, request_admin_problem
from potato_queue.store.keys import RUN_ID_RE

__all__ = ["admin_router", "admin_routes", "require_admin_key", "RunRequest", "MAX_RUNS_LISTED"]

MAX_RUNS_LISTED = 1000
# Bytes into run.log: a tebibyte is past any run.log (and below what every filesystem can seek to).
MAX_OFFSET = 2**40


class RunRequest(BaseModel):
    trainer: str = Field(max_length=200)
    schemas: list[str] = Field(min_length=1, max_length=100)
    backend: str | None = Field(None, max_length=200)
    params: dict[str, Any] = Field(
        default_factory=dict, description="the trainer's settings (at most 20 levels deep, 64 KiB)"
    )
    potato_run_id: str | None = Field(
        None,
        pattern=RUN_ID_RE.pattern,
        description=(
            "set by Potato's potato-queue-remote trainer: the Potato run this run trains for (Potato records it, so "
            "potato-queue does not record it in Potato's store again)"
        ),
    )


class RunAccepted(BaseModel):
    run_id: str
    state: str


def require_admin_key(request: Request, x_api_key: str | None = Header(default=None)) -> None:
    # The Guard middleware has refused a wrong key before the body was read; this documents the
    # header in the OpenAPI document, and holds should the router be mounted without the Guard.
    # The Training page's session cookie stands for the key (server/session.py); asking Redis
    # whether it is signed in once per request is enough.
    if admin_checked(request.scope):
        return
    problem = request_admin_problem(store_of(request), request.method, request.headers)
    if problem is not None:
        raise refusal(problem)


def post_run(body: RunRequest, request: Request) -> RunAccepted:
    """Queue a run (API-2): 409 for a backend the config does not name, 400 for anything else refused."""
    # A run started with the page's session cookie, not the API key, was started from the page.
    trigger = "api" if request.headers.get("x-api-key") is not None else "page"
    record = runs_of(request).submit(
        trainer=body.trainer,
        schemas=body.schemas,
        backend=body.backend,
        params=body.params,
        trigger="potato" if body.potato_run_id else trigger,
        potato_run_id=body.potato_run_id,
    )
    return RunAccepted(run_id=record["run_id"], state=RunState.QUEUED)


def list_runs(
    request: Request,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=MAX_RUNS_LISTED)] = 100,
    before: Annotated[str | None, Query(pattern=RUN_ID_RE.pattern, description="list the runs older than it")] = None,
) -> list[dict[str, Any]]:
    """The newest runs first, `limit` of them, older than run `before` where given; a run whose record cannot be
    read is listed with state `broken`. `X-Total-Count` says how many runs the project has; `X-Next-Before`
    (and a `Link` with rel="next") names the cursor of the next, older page, absent at the oldest run."""
    runs, total, older = runs_of(request).page(limit, before)
    response.headers["X-Total-Count"] = str(total)
    if older is not None:
        response.headers["X-Next-Before"] = older
        response.headers["Link"] = f'<{request.url.path}?limit={limit}&before={older}>; rel="next"'
    return runs


def get_run(run_id: str, request: Request) -> dict[str, Any]:
    return runs_of(request).get(run_id)


def cancel_run(run_id: str, request: Request) -> dict[str, Any]:
    """Cancel a queued or running run; 409 when it had already finished."""
    return {"run_id": run_id, "state": runs_of(request).cancel(run_id)}


def retry_run(run_id: str, request: Request) -> RunAccepted:
    """Queue a new run that resumes a failed or cancelled run from its checkpoints, on the same data; 409 when
    the run is not failed or cancelled, was retried already, or its bundle is gone."""
    record = runs_of(request).retry(run_id)
    return RunAccepted(run_id=record["run_id"], state=RunState.QUEUED)


class RerunBody(BaseModel):
    backend: str | None = Field(None, max_length=200, description="where to run it again; by default its own")


def rerun(run_id: str, request: Request, body: RerunBody | None = None) -> RunAccepted:
    """Queue an ended run again on the same bundle, trainer, schemas, params and seed (on `backend`, by default
    its own), to compare: `GET runs/{new}/compare/{run_id}` once it ends. 409: not ended, or its bundle gone."""
    record = runs_of(request).rerun(run_id, body.backend if body else None)
    return RunAccepted(run_id=record["run_id"], state=RunState.QUEUED)


def make_rater(run_id: str, request: Request) -> dict[str, Any]:
    """Make a succeeded run a machine rater in Potato (its held-out answers in a user state of its own, replacing
    the older run's of the same trainer and schemes); Potato shows it from its next start. 409: not succeeded."""
    return {"run_id": run_id, "machine_annotator": runs_of(request).make_rater(run_id)}


def remove_rater(run_id: str, request: Request) -> dict[str, Any]:
    """Take a run's machine rater out of Potato, every answer of it. 409: the run is not the rater."""
    return {"run_id": run_id, "removed": runs_of(request).remove_rater(run_id)}


def run_events(run_id: str, request: Request, after: Annotated[int, Query(ge=0)] = 0) -> list[dict[str, Any]]:
    """The run's events from the `after`-th on."""
    return runs_of(request).events(run_id, after)


def run_log(run_id: str, request: Request, offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0) -> str:
    """run.log from byte `offset` on (to follow it)."""
    return runs_of(request).log(run_id, offset)


def trainers() -> dict[str, dict[str, Any]]:
    """The registry, and which of each trainer's packages this server lacks (a local run's install hint)."""
    table = trainer_table()
    for info in table.values():
        info["missing_here"] = [name for name in info["packages"] if importlib.util.find_spec(name) is None]
    return table


def schemas(request: Request) -> list[dict[str, Any]]:
    """The config's schemes as written, each with Potato's kind of it, the modality of its items (what a
    trainer must declare to take it) and, for a type no run trains, why (`refused`)."""
    config = request.app.state.config
    modality = project_modality(config)  # the items once, for every scheme
    return [
        {**scheme, "kind": schema_kind(scheme), "modality": modality, "refused": type_refusal(scheme)}
        for scheme in config.annotation_schemes
    ]


def _label(name: str, kind: str, host: str | None, device: str | None) -> str:
    """How the page's Runs on menu names a backend (the tutorial's forms)."""
    if kind == "local":
        return f"{name} (this machine, {device or 'its device is being checked'})"
    if kind == "agent":
        return f"{name} (agent)"
    if kind == "ray":
        return f"{name} (ray at {host})"
    return f"{name} ({kind} to {host})" if kind == "ssh" else f"{name} ({kind} on {host})"


def backends(request: Request) -> list[dict[str, Any]]:
    """Every backend, with the menu's label; `default` marks model_training.backend."""
    mt = request.app.state.config.model_training
    probe = getattr(request.app.state, "local_device", None)
    device = probe(30.0) if probe else None
    rows = [{"name": LOCAL, "type": "local", "host": None}]
    # A Ray backend's "host" is its head's Jobs API (host:port).
    rows += [
        {"name": n, "type": b.type, "host": getattr(b, "host", getattr(b, "head", None))}
        for n, b in mt.backends.items()
    ]
    for row in rows:
        row["label"] = _label(row["name"], row["type"], row["host"], device)
        row["default"] = row["name"] == mt.default_backend
    return rows


def predictions(request: Request) -> list[dict[str, Any]]:
    return published_predictions(request.app.state.config)


def auto_retrain(request: Request) -> dict[str, Any]:
    """What auto-retrain is doing: the last beat check's reason (`waiting for 7 more annotations`)."""
    from potato_queue.runs.retrain import last_check

    return last_check(request.app.state.config, store_of(request))


def drain_backend(backend: str, request: Request) -> dict[str, Any]:
    """Switch draining on for an agent backend: its agents finish their run, claim no new one, and exit."""
    return runs_of(request).switch_drain(backend, True)


def undrain_backend(backend: str, request: Request) -> dict[str, Any]:
    """Switch draining off: the backend's agents (started again) claim runs again."""
    return runs_of(request).switch_drain(backend, False)


def budget(request: Request) -> dict[str, Any]:
    """The month's GPU-hours and energy caps (model_training.budget): each with what it used and has left."""
    from potato_queue.runs.budget import budget_standing

    return budget_standing(request.app.state.config, store_of(request))


class StrikeBody(BaseModel):
    reason: str = Field(min_length=1, max_length=500, description="why the run's use counts toward no budget")


def strike_usage(run_id: str, body: StrikeBody, request: Request) -> dict[str, Any]:
    """Strike an ended run's GPU use from every budget (a host that sent figures no run could use, a test run),
    recorded in the run's record and run.log. 409: the run is not ended, or was struck already."""
    return {"run_id": run_id, "usage_struck": runs_of(request).strike_usage(run_id, body.reason)}


# What the admin API serves to read, each a GET with no refusal of its own.
_READS: dict[str, Callable[..., Any]] = {
    "/trainers": trainers,
    "/schemas": schemas,
    "/backends": backends,
    "/predictions": predictions,
    "/auto_retrain": auto_retrain,
    "/budget": budget,
}
_UNKNOWN_RUN = refusals({404: "no such run"})
# Every admin route's refusals: the Guard's (server/guard.py), before the route runs.
_ADMIN_REFUSALS = {
    401: "no admin key or session, or a wrong one",
    403: "a cross-site request (the session cookie without the page's token)",
    413: "a body over 1 MiB",
}


def admin_routes(tag: str, why_of_status: dict[int, str] | None = None) -> APIRouter:
    """A router behind the admin key or the page's session; *why_of_status*: the refusals every route of it
    may answer besides the Guard's."""
    return APIRouter(
        dependencies=[Depends(require_admin_key)],
        tags=[tag],
        responses=refusals({**_ADMIN_REFUSALS, **(why_of_status or {})}),
    )


def admin_router() -> APIRouter:
    router = admin_routes("admin")
    add = router.add_api_route
    submit_refusals = {
        400: "an unknown trainer or schema, params too deep or large, a backend this version cannot run",
        409: "a backend the config does not name",
        507: "the project's output folder cannot be written",
    }
    add(
        "/runs",
        post_run,
        methods=["POST"],
        status_code=202,
        response_model=RunAccepted,
        responses=refusals(submit_refusals),
    )
    add("/runs", list_runs, methods=["GET"], responses=refusals({404: "`before` is no run"}))
    add("/runs/{run_id}", get_run, methods=["GET"], responses=_UNKNOWN_RUN)
    add("/runs/{run_id}/cancel", cancel_run, methods=["POST"], responses=_refused("the run had already finished"))
    _add_run_actions(add)
    add("/runs/{run_id}/events", run_events, methods=["GET"], responses=_UNKNOWN_RUN)
    add("/runs/{run_id}/log", run_log, methods=["GET"], response_class=PlainTextResponse, responses=_UNKNOWN_RUN)
    for path, read in _READS.items():
        add(path, read, methods=["GET"])
    struck = {400: "a reason of only whitespace", 409: "the run is not ended, or its use was struck already"}
    add(
        "/runs/{run_id}/strike_usage",
        strike_usage,
        methods=["POST"],
        responses=refusals({404: "no such run", **struck}),
    )
    not_agent = refusals({404: "no such backend", 409: "not an agent backend"})
    add("/backends/{backend}/drain", drain_backend, methods=["POST"], responses=not_agent)
    add("/backends/{backend}/drain", undrain_backend, methods=["DELETE"], responses=not_agent)
    return router


def _refused(why: str) -> Responses:
    return refusals({404: "no such run", 409: why})


def _add_run_actions(add: Callable[..., Any]) -> None:
    """What an ended run can become: retried, run again, a machine rater in Potato."""
    accepted: dict[str, Any] = {"methods": ["POST"], "status_code": 202, "response_model": RunAccepted}
    why = "the run is not failed or cancelled, was retried already, or its bundle was removed"
    add("/runs/{run_id}/retry", retry_run, responses=_refused(why), **accepted)
    add("/runs/{run_id}/rerun", rerun, responses=_refused("not ended, or its bundle was removed"), **accepted)
    not_rater = _refused("not a succeeded run, or not the rater")
    add("/runs/{run_id}/rater", make_rater, methods=["POST"], responses=not_rater)
    add("/runs/{run_id}/rater", remove_rater, methods=["DELETE"], responses=not_rater)
