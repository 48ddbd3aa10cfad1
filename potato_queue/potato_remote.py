"""`potato-queue-remote`: a trainer Potato runs like its own, which trains on a potato-queue backend.

Potato's Training page (and its auto-retrain) start it in Potato's worker child. It queues the run on
potato-queue's server (the backend in its params), relays the run's step and progress as Potato's
own events, cancels the potato-queue run when Potato stops it, and hands Potato the predictions for
the items Potato asks about, so Potato's manager ingests and publishes them at once. Potato records
this run itself; the potato-queue run carries Potato's run id and is not recorded a second time.

The server is `params.server`, else $POTATO_QUEUE_URL, else http://127.0.0.1:8000; the admin key
comes from $POTATO_QUEUE_API_KEY or $POTATO_ADMIN_API_KEY in Potato's environment, never a param.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

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

__all__ = ["RemoteTrainer", "QueueClient", "REMOTE_PREDICTIONS", "DEFAULT_SERVER"]

DEFAULT_SERVER = "http://127.0.0.1:8000"
API = "/admin/training/api"
REMOTE_PREDICTIONS = "potato-queue-predictions.jsonl"
POLL_S = 0.5
# Potato checks its wall limit only when its worker prints a line: one at least this often.
BEAT_S = 2.0
LOST_AFTER_S = 60.0
KEY_ENVS = ("POTATO_QUEUE_API_KEY", "POTATO_ADMIN_API_KEY")


class QueueClient:
    """potato-queue's admin API, with the key in its header."""

    def __init__(self, server: str, key: str) -> None:
        self.server, self._key = server.rstrip("/"), key

    @classmethod
    def from_env(cls, server: str | None) -> QueueClient:
        key = next((os.environ[k] for k in KEY_ENVS if os.environ.get(k)), None)
        if key is None:
            raise TrainerError(f"{TRAINER_NAME} needs potato-queue's admin key: set POTATO_QUEUE_API_KEY (or "
                               "POTATO_ADMIN_API_KEY) in the environment Potato runs in")
        return cls(server or os.environ.get("POTATO_QUEUE_URL") or DEFAULT_SERVER, key)

    def call(self, method: str, path: str, body: Any = None) -> bytes:
        req = urllib.request.Request(self.server + API + path, method=method,
                                     data=None if body is None else json.dumps(body).encode())
        req.add_header("X-API-Key", self._key)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            raise TrainerError(f"potato-queue at {self.server} refused {method} {path}: {err.code} {detail}") from None
        except (urllib.error.URLError, OSError) as err:
            raise TrainerError(f"potato-queue's server at {self.server} cannot be reached ({err}); start it "
                               "(potato-queue serve CONFIG) or set POTATO_QUEUE_URL") from None

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
            self.report.progress(str(progress.get("phase") or "train"), int(progress.get("current") or 0),
                                 int(progress["total"]), progress.get("eta_s"))


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
        return {"type": "object", "additionalProperties": False, "properties": {
            "backend": {"type": ["string", "null"], "description": "potato-queue backend (default: its model_training.backend)"},
            "trainer": {"type": "string", "description": "potato-queue trainer, e.g. hf-text-classification"},
            "params": {"type": "object", "description": "that trainer's params"},
            "server": {"type": ["string", "null"], "description": "potato-queue's server (default $POTATO_QUEUE_URL)"}}}

    def fit(self, spec: TrainingSpec, bundle: BundleRef, report: ProgressReporter) -> FitResult:
        p = {**self.default_params(), **(spec.params or {})}
        client = QueueClient.from_env(p.get("server"))
        body = {"trainer": p["trainer"], "schemas": [s.name for s in spec.schemas], "backend": p.get("backend"),
                "params": p.get("params") or {}, "potato_run_id": spec.run_id}
        queued = client.json("POST", "/runs", body)["run_id"]
        report.log("info", f"queued potato-queue run {queued} ({p['trainer']} on {p.get('backend') or 'its default backend'}) "
                           f"at {client.server}")
        run = self._follow(client, queued, report)
        if run["state"] != RunState.SUCCEEDED:
            raise TrainerError(f"potato-queue run {queued} {run['state']}: {run.get('error') or 'see its run.log'}")
        os.makedirs(spec.workdir, exist_ok=True)
        with open(os.path.join(spec.workdir, REMOTE_PREDICTIONS), "wb") as fh:
            fh.write(client.call("GET", f"/runs/{queued}/predictions.jsonl"))
        return FitResult(model_version=run.get("model_version") or f"potato-queue-{queued}",
                         artifact_paths=[REMOTE_PREDICTIONS], metrics=potato_metrics(run),
                         notes=[f"trained by potato-queue run {queued} on {run.get('ran_on')}; "
                                f"model files: {run.get('artifact_uri') or 'not kept'}"])

    def _follow(self, client: QueueClient, run_id: str, report: ProgressReporter) -> dict[str, Any]:
        relay, cancelled, reached_s = _Relay(report), False, time.monotonic()
        while True:
            try:
                if report.should_stop() and not cancelled:
                    client.json("POST", f"/runs/{run_id}/cancel")
                    report.log("info", f"cancelled potato-queue run {run_id}")
                    cancelled = True
                run = client.json("GET", f"/runs/{run_id}")
                reached_s = time.monotonic()
            except TrainerError as exc:  # a server restart is a blip; a server gone for long is the end
                if time.monotonic() - reached_s > LOST_AFTER_S:
                    raise TrainerError(f"{exc}; for {LOST_AFTER_S:g} s, so Potato stops following potato-queue run "
                                       f"{run_id}, which may still be running there") from None
                time.sleep(POLL_S)
                continue
            if run["state"] in FINAL_STATES:
                return run
            relay.show(run)
            time.sleep(POLL_S)

    def predict(self, spec: TrainingSpec, artifact_dir: str, items: Iterable[PredictItem],
                report: ProgressReporter) -> Iterator[PredictionRecord]:
        by_item: dict[str, list[dict[str, Any]]] = {}
        with open(os.path.join(artifact_dir, REMOTE_PREDICTIONS), encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    row = json.loads(line)
                    by_item.setdefault(str(row["instance_id"]), []).append(row)
        for item in items:
            for row in by_item.get(str(item.instance_id), []):
                yield PredictionRecord(instance_id=str(item.instance_id), schema_name=row["schema_name"],
                                       payload=row.get("payload"), confidence=row.get("confidence"))
