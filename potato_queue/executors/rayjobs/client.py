"""The calls the ray executor makes to Ray's Jobs API (REST: the server needs no `ray` package).

The auth token (RAY_AUTH_MODE=token) comes from the server's environment variable the backend names, and goes
only into the Authorization header: never a URL, a command line or a log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from potato_queue.backends.models import RayBackend
from potato_queue.errors import PotatoQueueError
from potato_queue.executors.rayjobs.text import JobState, job_state

__all__ = ["RayJobs", "RayError", "CALL_TIMEOUT_S"]

CALL_TIMEOUT_S = 10.0


class RayError(PotatoQueueError):
    """The Jobs API could not be reached, or refused the call."""


class RayJobs:
    """One backend's Jobs API."""

    def __init__(self, backend: RayBackend, environment: Mapping[str, str], timeout_s: float = CALL_TIMEOUT_S) -> None:
        """`environment`: the process's, as its edge read it (Settings.environment), where token_env is looked up."""
        self.backend = backend
        headers = {}
        if backend.token_env:
            token = environment.get(backend.token_env, "")
            if not token:
                raise RayError(
                    f"The ray backend's token_env names {backend.token_env}, which is not set in this process",
                    fix=f"export {backend.token_env} with the cluster's auth token before starting potato-queue",
                )
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(base_url=backend.address.rstrip("/"), headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            reply = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RayError(
                f"Ray's Jobs API at {self.backend.address} does not answer: {type(exc).__name__}: {exc}",
                fix="check that the head runs and that this machine reaches it (address: the dashboard's port, 8265)",
            ) from None
        if reply.status_code in (401, 403):
            which = "no token was sent" if reply.status_code == 401 else "the token was refused"
            raise RayError(
                f"Ray's Jobs API at {self.backend.address} refused potato-queue ({reply.status_code}: {which})",
                fix="set the backend's token_env to the name of an environment variable holding the cluster's "
                "token (ray get-auth-token), exported where potato-queue runs",
            )
        return reply

    def _json(self, reply: httpx.Response, what: str) -> Any:
        if reply.status_code >= 400:
            raise RayError(f"Ray refused {what}: HTTP {reply.status_code}: {reply.text[:500]}")
        try:
            return reply.json()
        except ValueError:
            raise RayError(f"Ray answered {what} with something not JSON: {reply.text[:200]!r}") from None

    def version(self) -> dict[str, Any]:
        found = self._json(self._call("GET", "/api/version"), "GET /api/version")
        return found if isinstance(found, dict) else {}

    def submit(self, body: dict[str, Any]) -> str:
        reply = self._json(self._call("POST", "/api/jobs/", json=body), "the job's submission")
        return str(reply.get("submission_id") or body["submission_id"])

    def state(self, job_id: str) -> JobState | None:
        """The job's state; None when the head has no record of it (a restarted head keeps no job)."""
        reply = self._call("GET", f"/api/jobs/{job_id}")
        if reply.status_code == 404:
            return None
        return job_state(self._json(reply, f"GET job {job_id}"))

    def wait_for(
        self, job_id: str, done: Callable[[JobState | None], bool], timeout_s: float, every_s: float = 0.25
    ) -> JobState | None:
        """The job's state once `done` holds of it, or the last one seen after timeout_s (None: no record, or
        no answer). A head that does not answer for a moment is asked again."""
        deadline_s, state = time.monotonic() + timeout_s, None
        while True:
            try:
                state = self.state(job_id)
                if done(state):
                    return state
            except (RayError, ValueError):
                pass
            if time.monotonic() >= deadline_s:
                return state
            time.sleep(every_s)

    def stop(self, job_id: str) -> bool:
        reply = self._call("POST", f"/api/jobs/{job_id}/stop")
        return reply.status_code < 400 and bool(reply.json().get("stopped"))

    def logs(self, job_id: str) -> str:
        reply = self._call("GET", f"/api/jobs/{job_id}/logs")
        return str(reply.json().get("logs") or "") if reply.status_code < 400 else ""

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes as the state API lists them."""
        found = self._json(self._call("GET", "/api/v0/nodes"), "GET /api/v0/nodes")
        return list(found.get("data", {}).get("result", {}).get("result", []))

    def usage(self) -> dict[str, list[float]]:
        """Each resource's [used, total] across the cluster."""
        found = self._json(self._call("GET", "/api/cluster_status"), "GET /api/cluster_status")
        report = found.get("data", {}).get("clusterStatus", {}).get("loadMetricsReport", {})
        return dict(report.get("usage") or {})
