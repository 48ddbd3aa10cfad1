"""Run records: durable on disk (run.json, run.log, events.jsonl), live in Redis.

The run directory is the truth (it survives a Redis restart); Redis holds
what changes every second (step, progress, heartbeat, cancel flag) and the
state, whose transitions are compare-and-set there so that a cancel and an
executor's start can never both win.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis

from potato_queue.config import ProjectConfig
from potato_queue.keys import RUN_ID_RE, Keys, RunPaths, new_run_id, runs_dir

__all__ = ["STATES", "FINAL_STATES", "RunStore", "write_json_atomic", "utc_now"]

STATES = ("queued", "starting", "running", "collecting", "succeeded", "failed", "cancelled")
FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
_ALLOWED_FROM = {
    "starting": ("queued",),
    "running": ("starting",),
    "collecting": ("starting", "running"),
    "succeeded": ("collecting",),
    "failed": ("queued", "starting", "running", "collecting"),
    "cancelled": ("queued", "starting", "running", "collecting"),
    "queued": ("queued",),
}
# Set the state only if it is one of ARGV[2..]; -1 when Redis has no live
# record (emptied), so the caller seeds it from disk and tries again.
_CAS = """
local cur = redis.call('HGET', KEYS[1], 'state')
if not cur then return -1 end
for i = 2, #ARGV do
  if cur == ARGV[i] then redis.call('HSET', KEYS[1], 'state', ARGV[1]) return 1 end
end
return 0
"""
_LIVE_JSON = ("progress", "metrics", "result")


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_json_atomic(path: Path, data: Any) -> None:
    """Temp file in the same folder, fsync, rename: a reader sees old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunStore:
    """One project's runs."""

    def __init__(self, config: ProjectConfig, client: redis.Redis) -> None:
        self.config = config
        self.redis = client
        self.keys = Keys.of(config)
        self._cas = client.register_script(_CAS)
        self._created: dict[str, str] = {}

    # -- records ---------------------------------------------------------
    def paths(self, run_id: str) -> RunPaths:
        return RunPaths.of(self.config, run_id)

    def create(self, *, trainer: str, schemas: list[str], backend: str, params: dict[str, Any] | None = None,
               trigger: str = "api") -> dict[str, Any]:
        run_id = new_run_id()
        record = {
            "run_id": run_id, "state": "queued", "backend": backend, "trainer": trainer,
            "schemas": list(schemas), "params": dict(params or {}), "trigger": trigger,
            "created_at": utc_now(), "started_at": None, "finished_at": None,
            "error": None, "metrics": {}, "held_out": {}, "exit_code": None, "artifact_uri": None,
        }
        paths = self.paths(run_id)
        paths.dir.mkdir(parents=True, exist_ok=False)
        write_json_atomic(paths.run_json, record)
        self._seed_live(run_id, "queued", time.time())
        return record

    def _seed_live(self, run_id: str, state: str, created_s: float) -> None:
        pipe = self.redis.pipeline()
        pipe.hset(self.keys.run(run_id), mapping={"state": state})
        pipe.zadd(self.keys.runs, {run_id: created_s}, nx=True)
        pipe.execute()

    def read(self, run_id: str) -> dict[str, Any]:
        """run.json as written (KeyError when there is no such run)."""
        try:
            return json.loads(self.paths(run_id).run_json.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            raise KeyError(run_id) from None

    def get(self, run_id: str) -> dict[str, Any]:
        """run.json with the live fields from Redis laid over it."""
        record = self.read(run_id)
        live = self.live(run_id)
        if record["state"] not in FINAL_STATES:
            # A final state shows once run.json has it: Redis changes first, so
            # for a moment it is final there while the record is still being written.
            if live.get("state") not in FINAL_STATES:
                record["state"] = live.get("state", record["state"])
            for key in ("step", "progress", "heartbeat_at"):
                if key in live:
                    record[key] = live[key]
        record.setdefault("step", None)
        record.setdefault("progress", None)
        return record

    def run_ids(self) -> list[str]:
        """Every run on disk, oldest first.

        Ids carry only whole seconds and a random tail, so runs created in the
        same second are ordered by run.json's created_at (milliseconds),
        cached since it never changes.
        """
        folder = runs_dir(self.config)
        if not folder.is_dir():
            return []
        ids = [p.name for p in folder.iterdir() if RUN_ID_RE.match(p.name) and (p / "run.json").exists()]
        return sorted(ids, key=self._created_at)

    def _created_at(self, run_id: str) -> str:
        if run_id not in self._created:
            self._created[run_id] = self.read(run_id)["created_at"]
        return self._created[run_id]

    def list_runs(self, limit: int = 100) -> list[dict[str, Any]]:
        return [self.get(run_id) for run_id in reversed(self.run_ids()[-limit:])]

    def update(self, run_id: str, **fields: Any) -> dict[str, Any]:
        """Write fields (not the state) into run.json."""
        assert "state" not in fields, "use transition() for the state"
        record = self.read(run_id)
        record.update(fields)
        write_json_atomic(self.paths(run_id).run_json, record)
        return record

    def transition(self, run_id: str, state: str, **fields: Any) -> bool:
        """Move to `state` if the current state allows it; write run.json. False if it did not."""
        allowed = _ALLOWED_FROM[state]
        key = self.keys.run(run_id)
        won = self._cas(keys=[key], args=[state, *allowed])
        if won == -1:
            on_disk = self.read(run_id)["state"]
            self.redis.hsetnx(key, "state", on_disk)
            won = self._cas(keys=[key], args=[state, *allowed])
        if won != 1:
            return False
        record = self.read(run_id)
        record.update(fields, state=state)
        if state in FINAL_STATES:
            record["finished_at"] = record.get("finished_at") or utc_now()
            record.update(self._live_snapshot(run_id))
        write_json_atomic(self.paths(run_id).run_json, record)
        return True

    def _live_snapshot(self, run_id: str) -> dict[str, Any]:
        live = self.live(run_id)
        return {k: live[k] for k in ("step", "progress") if k in live}

    # -- live state --------------------------------------------------------
    def live(self, run_id: str) -> dict[str, Any]:
        raw = self.redis.hgetall(self.keys.run(run_id))
        out: dict[str, Any] = {}
        for key, value in raw.items():
            k = key.decode() if isinstance(key, bytes) else key
            v = value.decode() if isinstance(value, bytes) else value
            out[k] = json.loads(v) if k in _LIVE_JSON else (float(v) if k == "heartbeat_at" else v)
        return out

    def set_live(self, run_id: str, **fields: Any) -> None:
        mapping = {k: json.dumps(v) if k in _LIVE_JSON else str(v) for k, v in fields.items() if v is not None}
        if mapping:
            self.redis.hset(self.keys.run(run_id), mapping=mapping)

    def signal_result(self, run_id: str) -> None:
        pipe = self.redis.pipeline()
        pipe.rpush(self.keys.result_signal(run_id), "1")
        pipe.expire(self.keys.result_signal(run_id), 3600)
        pipe.execute()

    def wait_result(self, run_id: str, timeout_s: float) -> None:
        """Sleep up to timeout_s, waking as soon as the agent's result arrives."""
        self.redis.blpop([self.keys.result_signal(run_id)], timeout=timeout_s)

    def touch_heartbeat(self, run_id: str) -> None:
        self.redis.hset(self.keys.run(run_id), "heartbeat_at", repr(time.time()))

    def heartbeat_age_s(self, run_id: str) -> float | None:
        value = self.redis.hget(self.keys.run(run_id), "heartbeat_at")
        return None if value is None else time.time() - float(value)

    def log(self, run_id: str, message: str) -> None:
        """A line in run.log, what the admin reads."""
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        with open(self.paths(run_id).run_log, "a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {message}\n")

    # -- cancel ------------------------------------------------------------
    def request_cancel(self, run_id: str) -> str:
        """Flag the run for cancel; a queued run ends cancelled at once. Returns the state now."""
        record = self.get(run_id)
        if record["state"] in FINAL_STATES:
            return record["state"]
        self.signal_stop(run_id)
        if record["state"] == "queued" and self.transition(run_id, "cancelled"):
            self.log(run_id, "cancelled while queued; it will not start")
            return "cancelled"
        self.log(run_id, "cancel requested")
        return self.get(run_id)["state"]

    def signal_stop(self, run_id: str) -> None:
        """Tell the run's agent to stop its worker (cancel, wall limit); the state is decided elsewhere."""
        pipe = self.redis.pipeline()
        pipe.set(self.keys.cancel(run_id), "1")
        pipe.publish(self.keys.control(run_id), "cancel")
        pipe.execute()

    def cancel_requested(self, run_id: str) -> bool:
        return bool(self.redis.exists(self.keys.cancel(run_id)))

    # -- run tokens ----------------------------------------------------------
    def issue_run_token(self, run_id: str) -> str:
        """A fresh token for one run; only its sha256 is kept."""
        token = secrets.token_urlsafe(32)
        self.redis.set(self.keys.run_token(run_id), _digest(token))
        return token

    def verify_run_token(self, run_id: str, token: str) -> bool:
        stored = self.redis.get(self.keys.run_token(run_id))
        if stored is None:
            return False
        stored_text = stored.decode() if isinstance(stored, bytes) else stored
        return secrets.compare_digest(stored_text, _digest(token))

    def revoke_run_token(self, run_id: str) -> None:
        self.redis.delete(self.keys.run_token(run_id))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
