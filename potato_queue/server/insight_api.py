"""What a run says beyond its scores (potato_queue/insight/): under /admin/training/api like the rest (the
X-API-Key header, or the Training page's session cookie with its CSRF token). Every answer is read from
the run's predictions, its bundle and the project's annotations on this server: the same for a run of
any backend.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request

from potato_queue.errors import NotFound
from potato_queue.insight.compare import compare_runs
from potato_queue.insight.inputs import RunInputs, predictions_summary_of, read_inputs
from potato_queue.insight.potato_order import hand_to_potato
from potato_queue.insight.report import DEFAULT_TARGET_PRECISION, learning_curve, next_items, quality
from potato_queue.insight.run_data import RunData, load_run
from potato_queue.server.admin_api import admin_routes
from potato_queue.server.deps import refusals, runs_of

__all__ = ["insight_router", "MAX_NEXT"]

MAX_NEXT = 10000


def _data(request: Request, run_id: str) -> RunData:
    runs = runs_of(request)
    return load_run(runs.store, runs.record(run_id))


def _inputs(request: Request, run_id: str, part: str) -> RunInputs:
    runs = runs_of(request)
    return read_inputs(runs.store, runs.record(run_id), (part,))


def run_predictions_summary(run_id: str, request: Request) -> dict[str, Any]:
    """What the run page shows of the run's predictions: how many, the lines that are not one, each schema's
    label counts and a sample (the whole file is GET /runs/{run_id}/predictions.jsonl)."""
    runs = runs_of(request)
    runs.record(run_id)  # NotFound for no such run
    if not runs.store.paths(run_id).predictions.exists():
        raise NotFound(f"run {run_id} has no predictions")
    return predictions_summary_of(runs.store, run_id)


def run_quality(
    run_id: str, request: Request, target_precision: Annotated[float, Query(gt=0, le=1)] = DEFAULT_TARGET_PRECISION
) -> dict[str, Any]:
    """Per-label precision and recall, the reliability diagram's bins, and the min_confidence that keeps the
    held-out precision at target_precision (shown, never applied)."""
    part = "quality" if target_precision == DEFAULT_TARGET_PRECISION else "held_out"
    return quality(_inputs(request, run_id, part), target_precision)


def run_curve(run_id: str, request: Request) -> dict[str, Any]:
    """The learning curve of a run started with params.learning_curve: held-out scores at 25/50/75/100 % of
    the train items, and the gain in words."""
    return learning_curve(runs_of(request).record(run_id))


def run_next(
    run_id: str,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=MAX_NEXT)] = 20,
    measure: Literal["margin", "entropy"] = "margin",
) -> dict[str, Any]:
    """What to label next: the run's unlabelled items (not labelled since), least sure first, near-copies
    of an item above them held back."""
    return next_items(request.app.state.config, _inputs(request, run_id, "next"), limit, measure)


def run_next_to_potato(run_id: str, request: Request) -> dict[str, Any]:
    """Write the whole order into the project's data files, where Potato's priority assignment reads it at
    its next start; 409, with nothing written, when Potato's config lacks the keys that make it serve it."""
    config = request.app.state.config
    found = next_items(config, _inputs(request, run_id, "next"), None)
    return hand_to_potato(config, [i["instance_id"] for i in found["items"]])


def runs_compared(run_id: str, other_id: str, request: Request) -> dict[str, Any]:
    """Run `run_id` (A) against `other_id` (B) on the held-out items both scored: per label, confusion
    matrices, McNemar, the items where they disagree with the annotators' labels beside them."""
    return compare_runs(request.app.state.config, _data(request, run_id), _data(request, other_id))


def insight_router() -> APIRouter:
    router = admin_routes(
        "insight",
        {
            404: "no such run",
            409: "the run has not succeeded, has no predictions or learning curve, or its bundle was removed",
        },
    )
    add = router.add_api_route
    add(
        "/runs/{run_id}/quality",
        run_quality,
        methods=["GET"],
        responses=refusals({400: "a target precision out of (0, 1]"}),
    )
    add("/runs/{run_id}/curve", run_curve, methods=["GET"])
    add("/runs/{run_id}/next", run_next, methods=["GET"])
    add("/runs/{run_id}/next/potato", run_next_to_potato, methods=["POST"])
    add("/runs/{run_id}/predictions/summary", run_predictions_summary, methods=["GET"])
    add(
        "/runs/{run_id}/compare/{other_id}",
        runs_compared,
        methods=["GET"],
        responses=refusals({400: "the same run twice, no schema or held-out item in common"}),
    )
    return router
