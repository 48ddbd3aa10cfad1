"""Publish a run's model to the Hugging Face Hub (runs/publish.py): start it, and follow it.

Under /admin/training/api like the rest (the X-API-Key header, or the Training page's session cookie with
its CSRF token). The upload runs in a thread of this process; the POST answers at once with `publishing`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, SecretStr

from potato_queue.runs.publish import MAX_REPO_ID, Publish, publish_status, start_publish
from potato_queue.server.admin_api import admin_routes
from potato_queue.server.deps import refusals, runs_of, store_of

__all__ = ["publish_router", "PublishRequest"]

# A Hub token is about 40 characters; a fine-grained one longer. Past this it is no token.
MAX_TOKEN_CHARS = 1000


class PublishRequest(BaseModel):
    repo_id: str = Field(max_length=200, description=f"namespace/name on the Hub (at most {MAX_REPO_ID} characters)")
    private: bool = Field(
        True, description="a new repo is private unless this is false; an existing repo keeps its visibility"
    )
    token: SecretStr | None = Field(
        None,
        max_length=MAX_TOKEN_CHARS,
        description=(
            "a Hub write token, used for this upload only and never stored; without it, the server's own "
            "(HF_TOKEN in its environment)"
        ),
    )


class HubState(BaseModel):
    state: str = Field(description="publishing, published or publish_failed (error says why)")
    repo_id: str
    private: bool
    url: str | None = None
    revision: str | None = None
    error: str | None = None
    started_at: str | None = None
    finished_at: str | None = None


class Refusal(BaseModel):
    message: str
    fix: str | None = None


class PublishStatus(BaseModel):
    run_id: str
    state: str = Field(description="the run's state (only a run that succeeded is published)")
    hub: HubState | None = Field(description="the last publish of the run; null before any")
    refused: Refusal | None = Field(description="why the run cannot be published, where it cannot")


def get_publish(run_id: str, request: Request) -> dict[str, Any]:
    """The run's last publish, and why it cannot be published where it cannot."""
    return publish_status(store_of(request), runs_of(request).record(run_id))


def post_publish(run_id: str, body: PublishRequest, request: Request) -> dict[str, Any]:
    """Publish the run's model (202: the upload goes on in the server; GET follows it)."""
    # A plain def: FastAPI runs it in its thread pool, so the first publish's import of huggingface_hub
    # (a second or so) does not hold the event loop.
    record = runs_of(request).record(run_id)
    token = body.token.get_secret_value() if body.token is not None else None
    wanted = Publish(repo_id=body.repo_id, private=body.private, token=token or None)
    return start_publish(store_of(request), record, wanted)


_NO_RUN = refusals({404: "no such run"})


def publish_router() -> APIRouter:
    router = admin_routes("admin")
    router.add_api_route(
        "/runs/{run_id}/publish", get_publish, methods=["GET"], response_model=PublishStatus, responses=_NO_RUN
    )
    router.add_api_route(
        "/runs/{run_id}/publish",
        post_publish,
        methods=["POST"],
        status_code=202,
        response_model=PublishStatus,
        responses=refusals(
            {
                404: "no such run",
                400: "not a Hub repo id, or no token to publish with",
                409: "the run did not succeed, its model files are not on this server, it is being published "
                "already, or huggingface_hub is not installed",
                507: "the project's output folder cannot be written",
            }
        ),
    )
    return router
