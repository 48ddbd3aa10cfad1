"""Run records: durable on disk (run.json, run.log, events.jsonl), live in Redis.

The run directory is the truth (it survives a Redis restart); Redis holds what changes every second (step,
progress, heartbeat, cancel flag: store.in_flight), the index of unfinished runs, and the state, whose
transitions are compare-and-set there so that a cancel and an executor's start can never both win. The store
owns its Redis: the server's routes, ingest and the run lifecycle ask it, and nothing else builds a key or
talks to Redis.
"""

from __future__ import annotations

import json
from typing import Any, cast

import redis

from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.config import ProjectConfig
from potato_queue.run import ALLOWED_FROM, FINAL_STATES, RECORD_VERSION, RunRecord, RunState, RunView, merge
from potato_queue.store.in_flight import RunsInFlight
from potato_queue.store.index import RunIndex
from potato_queue.store.keys import Keys, RunPaths, new_run_id, runs_dir
from potato_queue.store.lease import Lease
from potato_queue.store.listing import RunListing
from potato_queue.store.offers import Offers
from potato_queue.store.pending import PendingRecords
from potato_queue.store.plumbing import CAS_STATE
from potato_queue.store.potato_ledger import PotatoLedger
from potato_queue.store.presence import Presence
from potato_queue.store.records import (
    FOLDER_FIX,
    RunFolderError,
    RunMovedOn,
    created_ms,
    folder_error,
    log_text,
    record_lock,
    utc_now,
    write_json_atomic,
)
from potato_queue.store.retrain_state import RetrainState
from potato_queue.store.sessions import PageSessions, SignInTries
from potato_queue.store.tokens import AgentTokens, RunTokens
from potato_queue.store.webhooks import TrainingEventOutbox

__all__ = ["RunStore"]


class RunStore:
    """One project's runs."""

    def __init__(self, config: ProjectConfig, client: redis.Redis, clock: Clock = REAL_CLOCK) -> None:
        self.config = config
        self.clock = clock  # what stamps a heartbeat and a result (tests hand in a ManualClock)
        self.redis = client
        self.keys = Keys.of(config)
        self._cas = client.register_script(CAS_STATE)
        self._created: dict[str, str] = {}
        self._listing = RunListing(runs_dir(config), self._created_at, clock.now_s)
        self.in_flight = RunsInFlight(client, self.keys, clock)  # live fields, result, stop flag: Redis only
        self.tokens = RunTokens(client, self.keys)
        self.agents = AgentTokens(client, self.keys, clock)
        self.offers = Offers(client, self.keys, clock)
        self.pending = PendingRecords(client, self.keys)
        self.presence = Presence(client, self.keys, clock)
        self.retrain = RetrainState(client, self.keys, clock)  # auto-retrain's check lock and last outcome
        self.index = RunIndex(client, self.keys)  # the unfinished runs, the bulky ones, the newest
        self.sessions = PageSessions(client, self.keys)  # the Training page's, signed in
        self.sign_ins = SignInTries(client, self.keys, clock)  # each client's sign-in tries, for the backoff
        self.potato = PotatoLedger(config, log=self.log, clock=clock)  # the run as Potato's own Training page sees it
        # Its moves as training events for the project's webhooks (delivered by an executor's thread).
        self.webhooks = TrainingEventOutbox(client, self.keys, config, self.presence.server_url, clock)

    # -- records ---------------------------------------------------------
    def paths(self, run_id: str) -> RunPaths:
        return RunPaths.of(self.config, run_id)

    def create(
        self,
        *,
        trainer: str,
        schemas: list[str],
        backend: str,
        params: dict[str, Any] | None = None,
        trigger: str = "api",
        potato_run_id: str | None = None,
        resume_of: str | None = None,
        rerun_of: str | None = None,
        run_id: str | None = None,
    ) -> RunRecord:
        """A queued run's record (`run_id`: one chosen before, as a retry's claim names it; else a new one)."""
        run_id = run_id or new_run_id()
        record: RunRecord = {
            "run_id": run_id,
            "record_version": RECORD_VERSION,
            "state": RunState.QUEUED,
            "backend": backend,
            "trainer": trainer,
            "schemas": list(schemas),
            "params": dict(params or {}),
            "trigger": trigger,
            "created_at": utc_now(self.clock),
            "started_at": None,
            "finished_at": None,
            "error": None,
            "metrics": {},
            "held_out": {},
            "exit_code": None,
            "artifact_uri": None,
        }
        if potato_run_id is not None:
            record["potato_run_id"] = potato_run_id  # OWNED_BY_POTATO
        if resume_of is not None:
            record["resume_of"] = resume_of  # a retry (runs/retry.py)
        if rerun_of is not None:
            record["rerun_of"] = rerun_of  # a re-run on the same bundle and params (runs/rerun.py)
        paths = self.paths(run_id)
        try:
            paths.dir.mkdir(mode=0o700, parents=True, exist_ok=False)
            write_json_atomic(paths.run_json, record)
        except OSError as exc:
            raise RunFolderError(folder_error(paths.dir, exc), fix=FOLDER_FIX) from None
        self.in_flight.seed(record)
        self.potato.record(record)
        self.webhooks.moved(record)
        return record

    def read(self, run_id: str) -> RunRecord:
        """run.json as written (KeyError when there is no such run)."""
        try:
            return cast(RunRecord, json.loads(self.paths(run_id).run_json.read_text(encoding="utf-8")))
        except (FileNotFoundError, ValueError):
            raise KeyError(run_id) from None

    def get(self, run_id: str) -> RunRecord:
        """run.json with the live fields from Redis laid over it."""
        record = self.read(run_id)
        if record["state"] not in FINAL_STATES:  # nothing live is laid over an ended run: no Redis round trip
            record = self._with_live(record)
        record.setdefault("step", None)
        record.setdefault("progress", None)
        return record

    def _with_live(self, record: RunRecord) -> RunRecord:
        live = self.live(record["run_id"])
        if isinstance(live.get("pending_record"), dict):
            record = live["pending_record"]  # newer than run.json, which could not be written
        if record["state"] not in FINAL_STATES:
            # A final state shows once run.json has it: Redis changes first, so
            # for a moment it is final there while the record is still being written.
            if live.get("state") not in FINAL_STATES:
                record["state"] = live.get("state", record["state"])
            for key in ("step", "progress", "heartbeat_at", "gpu_usage"):
                if key in live:
                    record[key] = live[key]
        return record

    def run_ids(self) -> list[str]:
        """Every run on disk, oldest first (the admin's list; executors use unfinished()): store/listing.py."""
        return self._listing.ids()

    def vouch_listed(self, run_ids: set[str]) -> None:
        """These runs' folders held their run.json when the caller read them: the first listing need not look."""
        self._listing.vouch(run_ids)

    def _created_at(self, run_id: str) -> str:
        if run_id not in self._created:
            try:
                self._created[run_id] = str(self.read(run_id)["created_at"])
            except (KeyError, OSError, TypeError):
                return run_id  # unreadable: sorted by its id (which starts with the creation second)
        return self._created[run_id]

    def latest_succeeded(self, *, exclude: str | None = None) -> str | None:
        """The newest run that succeeded, from the run folders (the truth, even just after Redis was
        emptied): what decision-calibrate recalibrates and what retain_runs always keeps."""
        for run_id in reversed(self.run_ids()):
            try:
                if run_id != exclude and self.read(run_id)["state"] == RunState.SUCCEEDED:
                    return run_id
            except KeyError:
                continue  # unreadable: not a success anyone can build on
        return None

    def list_runs(self, limit: int = 100) -> list[RunRecord]:
        """The newest `limit` runs; one whose record cannot be read is listed as `broken`, never breaks the list."""
        return self.runs_page(limit)[0]

    def runs_page(self, limit: int, before: str | None = None) -> tuple[list[RunRecord], int, str | None]:
        """(the `limit` runs older than run `before`, newest first; how many runs the project has; the cursor of
        the next, older page: its last run's id, None at the oldest). KeyError: `before` is no run here."""
        ids = self.run_ids()
        try:
            end = len(ids) if before is None else ids.index(before)
        except ValueError:
            raise KeyError(before) from None
        page = ids[max(0, end - limit) : end]
        older = page[0] if page and page[0] != ids[0] else None
        return [self.listing_record(run_id) for run_id in reversed(page)], len(ids), older

    def listing_record(self, run_id: str) -> RunRecord:
        """The run's record as a listing shows it: `broken`, saying why, where it cannot be read."""
        try:
            return self.get(run_id)
        except (KeyError, OSError, ValueError, TypeError) as exc:
            why = f"{type(exc).__name__}: {exc}" if not isinstance(exc, KeyError) else "it is missing or not JSON"
            return {"run_id": run_id, "state": RunState.BROKEN, "error": f"run.json cannot be read ({why})"}

    def update(
        self, run_id: str, record: RunRecord | None = None, *, potato_row: bool = False, **fields: Any
    ) -> RunRecord:
        """Write fields (not the state) into run.json (and Potato's row: `potato_row`); `record`: the one held
        in memory, refused (RunMovedOn, nothing written) once a sweep or a cancel moved the run on."""
        assert "state" not in fields, "use transition() for the state"
        with record_lock(self.paths(run_id).dir):
            if record is None:
                record = self.read(run_id)
            elif self.in_flight.state(run_id) not in (None, record["state"]):
                raise RunMovedOn(
                    f"Run {run_id} is {self.in_flight.state(run_id)} now, no longer {record['state']}: "
                    f"this executor's step was not recorded"
                )
            merge(record, fields)
            if potato_row:
                self.potato.record(record)
            self._write_record(run_id, record)
        return record

    def transition(
        self, run_id: str, state: RunState, record: RunRecord | None = None, *, said: str | None = None, **fields: Any
    ) -> RunRecord | None:
        """Move to `state` if the current state allows it and write run.json: the record written, or None
        (not allowed, or moved on before it was written). `record`: held in memory, run.json not read.
        `said`: run.log's line for the move, only when it happens."""
        if not self._compare_and_set(run_id, state):
            return None
        with record_lock(self.paths(run_id).dir):
            if self.in_flight.state(run_id) not in (None, state):
                return None  # moved on by another (a sweep, a cancel), who writes its own record
            record = self.read(run_id) if record is None else record
            merge(record, {**fields, "state": state})
            if state in FINAL_STATES:
                record["finished_at"] = record.get("finished_at") or utc_now(self.clock)
                live = self.live(run_id)
                merge(record, {k: live[k] for k in ("step", "progress", "gpu_usage") if k in live})
            # run.json last: whoever reads the new state there (the API, `training logs -f`) finds
            # run.log's line and Potato's row of it already written.
            if said is not None:
                self.log(run_id, said)
            self.potato.record(record)
            self._write_record(run_id, record)
            if state in FINAL_STATES:
                self.in_flight.expire_finished(run_id)
        if state != RunState.QUEUED:  # a pull backend's dispatch keeps it queued: no second queued event
            self.webhooks.moved(record)
        return record

    def _write_record(self, run_id: str, record: RunRecord) -> None:
        """run.json, or, when the folder cannot be written, the record held in Redis and RunFolderError."""
        try:
            write_json_atomic(self.paths(run_id).run_json, record)
        except OSError as exc:
            error = folder_error(self.paths(run_id).dir, exc)
            self.pending.hold(run_id, {**record, "error": record.get("error") or error}, error)
            raise RunFolderError(error, fix=FOLDER_FIX) from None

    def log(self, run_id: str, *messages: str) -> None:
        """Lines in run.log, what the admin reads (one write for them all). A folder that cannot be
        written is noted for the executor, which ends the run with it; the caller goes on."""
        try:
            with open(self.paths(run_id).run_log, "a", encoding="utf-8") as fh:
                fh.write(log_text(list(messages)))
        except OSError as exc:
            self.pending.note(run_id, folder_error(self.paths(run_id).dir, exc))

    def write_held_records(self) -> list[str]:
        """The records held while their folders could not be written, written now where they can be."""
        return self.pending.write_held(lambda run_id, record: write_json_atomic(self.paths(run_id).run_json, record))

    def _compare_and_set(self, run_id: str, state: RunState) -> bool:
        keys = [self.keys.run(run_id), self.keys.unfinished, self.keys.run_token(run_id)]
        args = [state, "1" if state in FINAL_STATES else "0", run_id, *ALLOWED_FROM[state]]
        won = self._cas(keys=keys, args=args)
        if won == -1:
            self.redis.hsetnx(keys[0], "state", self.read(run_id)["state"])
            won = self._cas(keys=keys, args=args)
        return bool(won == 1)

    def forget(self, run_id: str) -> None:
        """A run whose folder retention removed: out of Redis' indexes, its keys gone."""
        pipe = self.redis.pipeline()
        for index in (self.keys.runs, self.keys.unfinished, self.keys.bulky):
            pipe.zrem(index, run_id)
        pipe.delete(self.keys.run(run_id), self.keys.metrics(run_id))
        pipe.execute()

    # -- the indexes (store.index) -------------------------------------------
    def reseed_from_disk(self) -> list[str]:
        """After Redis was emptied: live states and the unfinished index from the run folders.
        Returns the ids of the queued runs Redis had lost (their wake-ups were lost with it)."""
        lost = []
        for run_id in self.run_ids():
            record = self.read(run_id)
            if self.in_flight.seed(record) and record["state"] == RunState.QUEUED:
                lost.append(run_id)
            if any(p.exists() for p in self.paths(run_id).bulky):
                self.index.mark_bulky(run_id, created_ms(record))
        return lost

    # -- leases ------------------------------------------------------------
    def slot_lease(self) -> Lease:
        """A holder's handle on the project's run slot (one run at a time, across executors); each
        caller takes its own, since a handle keeps its holder's token and renewal clock."""
        return Lease(self.redis, self.keys.slot)

    def budget_lease(self) -> Lease:
        """Held from a submission's budget check to its run's record (runs/budget.py), across processes."""
        return Lease(self.redis, self.keys.budget_lock)

    def publish_lease(self, run_id: str) -> Lease:
        """Held while a server process uploads the run's model to the Hugging Face Hub: one upload of a run
        at a time, and one whose server died lapses within seconds (runs/publish.py)."""
        return Lease(self.redis, self.keys.publishing(run_id))

    def publishing(self, run_id: str) -> bool:
        return bool(self.redis.exists(self.keys.publishing(run_id)))

    # -- cancel ------------------------------------------------------------
    def request_cancel(self, run_id: str) -> str:
        """Flag the run for cancel; a queued run ends cancelled at once. Returns the state now."""
        record = self.get(run_id)
        if record["state"] in FINAL_STATES:
            return record["state"]
        self.in_flight.signal_stop(run_id)
        if record["state"] == RunState.QUEUED and self.transition(
            run_id, RunState.CANCELLED, said="cancelled while queued; it will not start"
        ):
            return RunState.CANCELLED
        self.log(run_id, "cancel requested")
        return self.get(run_id)["state"]

    # -- a run in flight (store.in_flight): the calls many callers make, kept here --------------------
    def live(self, run_id: str) -> dict[str, Any]:
        return self.in_flight.live(run_id)

    def metrics(self, run_id: str) -> dict[str, Any]:
        return self.in_flight.metrics(run_id)

    def view(self, run_id: str) -> RunView:
        return self.in_flight.view(run_id)

    def touch_heartbeat(self, run_id: str) -> None:
        self.in_flight.touch_heartbeat(run_id)

    def record_result(self, run_id: str, exit_code: int, artifact_uri: str | None, message: str | None) -> str | None:
        return self.in_flight.record_result(run_id, exit_code, artifact_uri, message)
