"""What a route takes from the app it runs in: the project's config, its run store and its RunService
(create_app sets them)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import BaseModel

from potato_queue.config import ProjectConfig
from potato_queue.runs.service import RunService
from potato_queue.store import RunStore

__all__ = ["store_of", "config_of", "runs_of", "ErrorReply", "Responses", "refusals"]


class ErrorReply(BaseModel):
    """Every refusal's body: what was wrong and, after "; fix: ", what to do (server/guard.py's table)."""

    detail: str


# FastAPI's `responses`: what a route's OpenAPI document says besides its 200.
Responses = dict[int | str, dict[str, Any]]


def refusals(why_of_status: dict[int, str]) -> Responses:
    """The OpenAPI entries of a route's refusals: each status with ErrorReply's body and why it is sent."""
    return {status: {"model": ErrorReply, "description": why} for status, why in why_of_status.items()}


def store_of(request: Request) -> RunStore:
    return request.app.state.store  # type: ignore[no-any-return]


def config_of(request: Request) -> ProjectConfig:
    return request.app.state.config  # type: ignore[no-any-return]


def runs_of(request: Request) -> RunService:
    """The project's RunService: what every route asks of the runs."""
    return request.app.state.runs  # type: ignore[no-any-return]
