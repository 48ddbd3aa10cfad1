"""Schemathesis over the real server's OpenAPI document: no 5xx, no status the document does not name.

The admin routes get the project's key; the agent routes get a live run's token and its run id, so
the generated requests reach the routes' own code, not only the Guard. The example count is bounded
to keep the suite short; the server is a real `potato-queue serve` on a private Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance

from potato_queue.store import RunStore
from potato_queue.validate import load_checked
from tests.lifecycle_helpers import ADMIN_KEY, Services, job_as_the_executor_stores_it, started

EXAMPLES = 50


@schemathesis.serializer("application/x-ndjson")
def _ndjson(_ctx: Any, value: Any) -> bytes:
    """predictions.jsonl's body: whatever was generated, as bytes (a binary string schema)."""
    return value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, redis_server_url: str) -> Iterator[tuple[Services, str, str, str]]:
    """The server, a running run and its token (agent routes), and a queued run (admin routes); the agent
    backend `lab`'s token is in BACKEND_TOKEN (its claim route)."""
    tmp = tmp_path_factory.mktemp("schemathesis")
    with started(tmp, redis_server_url, executors=0, backends={"lab": {"type": "agent"}}) as svc:
        store = RunStore(load_checked(svc.config), redis.Redis.from_url(redis_server_url))
        run_id = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")["run_id"]
        job_as_the_executor_stores_it(store, run_id, b"not really a bundle, but bytes to download")
        assert store.transition(run_id, "starting") and store.transition(run_id, "running")
        admin_run = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")["run_id"]
        BACKEND_TOKEN.append(store.agents.issue("lab"))
        yield svc, run_id, store.tokens.issue(run_id, ttl_s=3600), admin_run


@pytest.fixture(scope="module")
def api_schema(served: tuple[Services, str, str, str]) -> Any:
    svc = served[0]
    return schemathesis.openapi.from_url(f"{svc.url}/openapi.json")


CALLS: list[int] = []
BACKEND_TOKEN: list[str] = []


def _call(case: Any, served: tuple[Services, str, str, str]) -> None:
    CALLS.append(1)
    svc, run_id, token, admin_run = served
    agent = case.path.startswith("/api/training/agent/v1/")
    if "{run_id}" in case.path:  # real runs, so requests reach the routes' own code, not only a 404
        case.path_parameters = {**(case.path_parameters or {}), "run_id": run_id if agent else admin_run}
    headers = {"Authorization": f"Bearer {token}"} if agent else {"X-API-Key": ADMIN_KEY}
    if "{backend}" in case.path:  # the claim: the agent backend's token, and no long wait
        case.path_parameters = {**(case.path_parameters or {}), "backend": "lab"}
        headers = {"Authorization": f"Bearer {BACKEND_TOKEN[0]}"}
        case.query = {**(case.query or {}), "wait_s": 0}
    if case.path.endswith("/control"):
        case.query = {**(case.query or {}), "wait_s": 0}  # a long-poll: answer at once
    case.call_and_validate(
        base_url=svc.url, headers=headers, checks=[not_a_server_error, status_code_conformance], timeout=60
    )


def test_no_route_answers_5xx_or_an_undocumented_status(
    api_schema: Any, served: tuple[Services, str, str, str]
) -> None:
    # Driven through schemathesis' Python API: its pytest plugin does not run on this pytest (9).
    failures, tried = {}, 0
    for result in api_schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: Any) -> None:
            _call(case, served)

        tried += 1
        try:
            check()
        except Exception as exc:  # noqa: BLE001 - every operation's failure is reported together
            failures[operation.label] = str(exc)[:2000]
    assert failures == {}, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    assert tried >= 15 and len(CALLS) >= 5 * tried, (tried, len(CALLS))


def test_the_suite_reaches_both_apis(api_schema: Any) -> None:
    paths = set(api_schema.raw_schema["paths"])
    assert any(p.startswith("/admin/training/api/") for p in paths)
    assert any(p.startswith("/api/training/agent/v1/") for p in paths)
