"""`potato-queue-remote`: a trainer Potato runs like its own, which trains on a potato-queue backend.

Potato's Training page (and its auto-retrain) start it in Potato's worker child. It queues the run on
potato-queue's server (the backend in its params), relays the run's step and progress as Potato's
own events, cancels the potato-queue run when Potato stops it, and hands Potato the predictions for
the items Potato asks about, so Potato's manager ingests and publishes them at once. Potato records
this run itself; the potato-queue run carries Potato's run id and is not recorded a second time.

The server is $POTATO_QUEUE_URL in Potato's environment, else http://127.0.0.1:8000; a run's `server` param
may only repeat it (whoever starts a run in Potato writes its params; the key is the admin's). The admin
key comes from $POTATO_QUEUE_API_KEY or $POTATO_ADMIN_API_KEY there, never a param, and goes over plain
http only to loopback unless $POTATO_QUEUE_ALLOW_PLAIN_HTTP=1.
"""

from __future__ import annotations

import ipaddress
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from potato.training.base import (
    BundleRef,
    FitResult,
    PredictionRecord,
    PredictItem,
    ProgressReporter,
    Trainer,
    TrainerError,
    TrainingSpec,
)

from potato_queue.potato_hook import TRAINER_NAME
from potato_queue.run import FINAL_STATES, RunState
from potato_queue.store.potato_ledger import potato_metrics
from potato_queue.wire.files import read_jsonl

__all__ = [
    "RemoteTrainer",
    "QueueClient",
    "Follower",
    "Unreachable",
    "server_for",
    "REMOTE_PREDICTIONS",
    "DEFAULT_SERVER",
    "URL_ENV",
    "PLAIN_HTTP_ENV",
]

DEFAULT_SERVER = "http://127.0.0.1:8000"
API = "/admin/training/api"
REMOTE_PREDICTIONS = "potato-queue-predictions.jsonl"
POLL_S = 0.5
# Potato checks its wall limit only when its worker prints a line: one at least this often.
BEAT_S = 2.0
KEY_ENVS = ("POTATO_QUEUE_API_KEY", "POTATO_ADMIN_API_KEY")
URL_ENV = "POTATO_QUEUE_URL"
PLAIN_HTTP_ENV = "POTATO_QUEUE_ALLOW_PLAIN_HTTP"
T = TypeVar("T")


def _origin(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of a server address, or TrainerError saying what is wrong with it."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower(), 0)
    except ValueError as exc:
        raise TrainerError(f"{url!r} is not a server address ({exc}); write it as http(s)://HOST:PORT") from None
    if (
        parts.scheme.lower() not in ("http", "https")
        or not parts.hostname
        or parts.username
        or parts.password
        or parts.query
        or parts.fragment
    ):
        raise TrainerError(
            f"{url!r} is not a server address potato-queue's key may go to; write it as "
            "http(s)://HOST:PORT, without a user, a query or a fragment"
        )
    return parts.scheme.lower(), parts.hostname.lower(), port, parts.path.rstrip("/")


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_for(param: str | None, env: Mapping[str, str]) -> str:
    """The one server the admin key may go to: $POTATO_QUEUE_URL in Potato's environment (else the default).

    A run's params are written by whoever may start a run in Potato; the key is the admin's. So a
    `server` param may only repeat that address, and the key goes over plain http only to loopback
    unless the admin set $POTATO_QUEUE_ALLOW_PLAIN_HTTP=1 there."""
    configured = (env.get(URL_ENV) or DEFAULT_SERVER).strip().rstrip("/")
    origin = _origin(configured)
    if param and _origin(param) != origin:
        raise TrainerError(
            f"params.server {param!r} is not this Potato's potato-queue server ({configured}, "
            f"from ${URL_ENV}): a run's params cannot choose where potato-queue's admin key is sent; "
            f"leave server out of the params (the admin sets ${URL_ENV} in Potato's environment)"
        )
    if origin[0] == "http" and not _loopback(origin[1]) and env.get(PLAIN_HTTP_ENV) != "1":
        raise TrainerError(
            f"potato-queue's server {configured} is plain http on another machine, so its admin key "
            f"would cross the network readable: give ${URL_ENV} an https address (the shipped "
            f"nginx), or set ${PLAIN_HTTP_ENV}=1 in Potato's environment to send it anyway"
        )
    return configured


class Unreachable(TrainerError):
    """potato-queue's server did not answer (or a proxy in front said it is down): worth waiting for."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect would carry the key's header to wherever it points: it is an error instead."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None


def _opener(server: str) -> urllib.request.OpenerDirector:
    """No redirects; a proxy only for https to another machine, where the proxy tunnels the encrypted
    request (CONNECT) and never sees the key. An http_proxy in Potato's environment would read the key in
    plain text, and would stand between Potato and a loopback server too (urllib does not exempt loopback)."""
    scheme, host, _port, _path = _origin(server)
    https_proxy = urllib.request.getproxies().get("https")
    proxies = {"https": https_proxy} if https_proxy and scheme == "https" and not _loopback(host) else {}
    return urllib.request.build_opener(urllib.request.ProxyHandler(proxies), _NoRedirect)


# A proxy in front of the server that lost it answers one of these.
_DOWN_STATUSES = (502, 503, 504)


class QueueClient:
    """potato-queue's admin API, with the key in its header, at the one server it may go to."""

    def __init__(self, server: str, key: str) -> None:
        self.server, self._key = server.rstrip("/"), key
        self._opener = _opener(self.server)

    @classmethod
    def from_env(cls, server: str | None, env: Mapping[str, str] | None = None) -> QueueClient:
        env = os.environ if env is None else env
        key = next((env[k] for k in KEY_ENVS if env.get(k)), None)
        if key is None:
            raise TrainerError(
                f"{TRAINER_NAME} needs potato-queue's admin key: set POTATO_QUEUE_API_KEY (or "
                "POTATO_ADMIN_API_KEY) in the environment Potato runs in"
            )
        return cls(server_for(server, env), key)

    def call(self, method: str, path: str, body: Any = None) -> bytes:
        req = urllib.request.Request(
            self.server + API + path, method=method, data=None if body is None else json.dumps(body).encode()
        )
        req.add_header("X-API-Key", self._key)
        req.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(req, timeout=60) as resp:
                return bytes(resp.read())
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            said = f"potato-queue at {self.server} refused {method} {path}: {err.code} {detail}"
            raise (Unreachable if err.code in _DOWN_STATUSES else TrainerError)(said) from None
        except (urllib.error.URLError, OSError) as err:
            raise Unreachable(
                f"potato-queue's server at {self.server} cannot be reached ({err}); start it "
                f"(potato-queue serve CONFIG) or set {URL_ENV}"
            ) from None

    def json(self, method: str, path: str, body: Any = None) -> Any:
        return json.loads(self.call(method, path, body))


class _Relay:
    """A potato-queue run's step and progress as Potato's events, with a line at least every BEAT_S."""

    def __init__(self, report: ProgressReporter) -> None:
        self.report = report
        self.last: tuple[Any, ...] = ()
        self.said_s = 0.0

    def show(self, run: dict[str, Any]) -> None:
        progress = run.get("progress") or {}
        now = (run.get("state"), run.get("step"), progress.get("current"))
        if now == self.last and time.monotonic() - self.said_s < BEAT_S:
            return
        self.last, self.said_s = now, time.monotonic()
        self.report.status("running", f"potato-queue: {run.get('state')} | {run.get('step') or ''}".rstrip(" |"))
        if progress.get("total"):
            self.report.progress(
                str(progress.get("phase") or "train"),
                int(progress.get("current") or 0),
                int(progress["total"]),
                progress.get("eta_s"),
            )


class Follower:
    """One potato-queue run followed to its end from Potato's worker, across outages of potato-queue's server.

    The run goes on while the server is down (a restart, an upgrade): the follower says so on Potato's step
    line, with for how long, and asks again until the server answers, then takes the run's end as if
    nothing happened. It gives up past the Potato run's own wall limit, or at once when Potato stops the
    run meanwhile (the cancel cannot reach potato-queue: the error says to cancel it there)."""

    def __init__(self, client: QueueClient, run_id: str, report: ProgressReporter, max_wall_s: float | None) -> None:
        self.client, self.run_id, self.report = client, run_id, report
        self.max_wall_s = max_wall_s
        self.started_s = time.monotonic()
        self.down_since_s: float | None = None
        self.said_s = 0.0
        self.cancelled = False

    def follow(self) -> dict[str, Any]:
        relay = _Relay(self.report)
        while True:
            run = self.patiently(self._look)
            if run["state"] in FINAL_STATES:
                return run
            relay.show(run)
            time.sleep(POLL_S)

    def _look(self) -> dict[str, Any]:
        if self.report.should_stop() and not self.cancelled:
            try:
                self.client.json("POST", f"/runs/{self.run_id}/cancel")
                self.report.log("info", f"cancelled potato-queue run {self.run_id}")
            except Unreachable:
                raise
            except TrainerError as exc:  # a 409: the run ended meanwhile; its end is read below
                self.report.log("info", f"potato-queue run {self.run_id} was not cancelled: {exc}")
            self.cancelled = True
        return dict(self.client.json("GET", f"/runs/{self.run_id}"))

    def patiently(self, call: Callable[[], T]) -> T:
        """`call()`, asked again while potato-queue's server cannot be reached."""
        while True:
            try:
                answer = call()
            except Unreachable as exc:
                self._wait(exc)
                continue
            if self.down_since_s is not None:
                self.report.log(
                    "info",
                    f"potato-queue's server at {self.client.server} answers again, after "
                    f"{time.monotonic() - self.down_since_s:.0f} s",
                )
                self.down_since_s = None
            return answer

    def _wait(self, exc: Unreachable) -> None:
        now_s = time.monotonic()
        if self.down_since_s is None:
            self.down_since_s = now_s
            self.report.log("warning", f"{exc}; potato-queue run {self.run_id} goes on there, asking again")
        down_s = now_s - self.down_since_s
        if self.report.should_stop() and not self.cancelled:
            raise TrainerError(
                f"Potato stopped this run while {exc}: potato-queue run {self.run_id} may still be "
                f"running there; cancel it once the server is back (potato-queue training cancel "
                f"{self.run_id} CONFIG)"
            ) from None
        if self.max_wall_s and now_s - self.started_s > self.max_wall_s:
            raise TrainerError(
                f"{exc}, for {down_s:.0f} s, and this run's wall limit ({self.max_wall_s:g} s) has "
                f"passed: Potato stops following potato-queue run {self.run_id}, which may still be "
                "running there"
            ) from None
        if now_s - self.said_s >= BEAT_S:  # Potato checks its wall limit only when a line comes
            self.said_s = now_s
            self.report.status(
                "running",
                f"potato-queue's server at {self.client.server} cannot be reached "
                f"for {down_s:.0f} s; run {self.run_id} goes on there, asking again",
            )
        time.sleep(POLL_S)


class RemoteTrainer(Trainer):
    name = TRAINER_NAME
    description = "Trains on a potato-queue backend and brings the predictions back."
    kinds = ("nominal", "multilabel")
    modalities = ("text",)
    licence = "MIT"
    commercial_use = True
    multi_schema = True

    @classmethod
    def default_params(cls) -> dict[str, Any]:
        return {"backend": None, "trainer": "sklearn-text", "params": {}, "server": None}

    @classmethod
    def params_schema(cls) -> dict[str, Any]:
        return {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "backend": {
                    "type": ["string", "null"],
                    "description": "potato-queue backend (default: its model_training.backend)",
                },
                "trainer": {"type": "string", "description": "potato-queue trainer, e.g. hf-text-classification"},
                "params": {"type": "object", "description": "that trainer's params"},
                "server": {
                    "type": ["string", "null"],
                    "description": "only $POTATO_QUEUE_URL (set by the admin) is accepted",
                },
            },
        }

    def fit(self, spec: TrainingSpec, bundle: BundleRef, report: ProgressReporter) -> FitResult:
        p = {**self.default_params(), **(spec.params or {})}
        client = QueueClient.from_env(p.get("server"))
        body = {
            "trainer": p["trainer"],
            "schemas": [s.name for s in spec.schemas],
            "backend": p.get("backend"),
            "params": p.get("params") or {},
            "potato_run_id": spec.run_id,
        }
        queued = client.json("POST", "/runs", body)["run_id"]
        report.log(
            "info",
            f"queued potato-queue run {queued} ({p['trainer']} on {p.get('backend') or 'its default backend'}) "
            f"at {client.server}",
        )
        follower = Follower(client, queued, report, spec.limits.max_wall_s)
        run = follower.follow()
        if run["state"] != RunState.SUCCEEDED:
            raise TrainerError(f"potato-queue run {queued} {run['state']}: {run.get('error') or 'see its run.log'}")
        predictions = follower.patiently(lambda: client.call("GET", f"/runs/{queued}/predictions.jsonl"))
        os.makedirs(spec.workdir, exist_ok=True)
        with open(os.path.join(spec.workdir, REMOTE_PREDICTIONS), "wb") as fh:
            fh.write(predictions)
        return FitResult(
            model_version=run.get("model_version") or f"potato-queue-{queued}",
            artifact_paths=[REMOTE_PREDICTIONS],
            metrics=potato_metrics(run),
            notes=[
                f"trained by potato-queue run {queued} on {run.get('ran_on')}; "
                f"model files: {run.get('artifact_uri') or 'not kept'}"
            ],
        )

    def predict(
        self, spec: TrainingSpec, artifact_dir: str, items: Iterable[PredictItem], report: ProgressReporter
    ) -> Iterator[PredictionRecord]:
        by_item: dict[str, list[dict[str, Any]]] = {}
        for _, row in read_jsonl(os.path.join(artifact_dir, REMOTE_PREDICTIONS)):
            by_item.setdefault(str(row["instance_id"]), []).append(row)
        for item in items:
            for row in by_item.get(str(item.instance_id), []):
                yield PredictionRecord(
                    instance_id=str(item.instance_id),
                    schema_name=row["schema_name"],
                    payload=row.get("payload"),
                    confidence=row.get("confidence"),
                )
