"""What a user, the Training page or an agent asks of one project's runs: each rule in one place.

The CLI, the admin API, the page and the agent API all call `RunService`; none
of them decides a run's rules itself. Refusals are errors.py's NotFound,
Conflict, Invalid and Denied, which each edge says once its own way (the HTTP
status in server/guard.py, the message, fix and exit code in the CLI). Nothing
here knows HTTP.

Two of the methods are the agent's named events: `claimed` (an agent backend's
agent took an offered run) and `heard_from` (any call of a run's agent). The
executor sees the first of them as the run's first contact (runs/supervise.py):
the run is then `running`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typing_extensions import Unpack

from potato_queue.config import ProjectConfig
from potato_queue.errors import Conflict, Denied, NotFound
from potato_queue.executors.base import CheckReport
from potato_queue.host.llm_fit import ModelAsk
from potato_queue.lab.usage import usage_words
from potato_queue.run import FINAL_STATES, RunMarks, RunRecord, RunState
from potato_queue.runs.submit import start_run
from potato_queue.runs.upgrades import predates
from potato_queue.store import RunStore
from potato_queue.store.offers import DENIED, DRAIN

__all__ = ["RunService", "Claimed", "log_from", "require_backend", "public_view", "LIST_FIX", "CLAIMED_TOKEN_TTL_S"]

LIST_FIX = "list them with: potato-queue training runs CONFIG"
# A claimed run's token lives at most this long (its end revokes it sooner): a pull run has no executor-side
# max_wall to derive it from before the claim.
CLAIMED_TOKEN_TTL_S = 30 * 24 * 3600


@dataclass(frozen=True)
class Claimed:
    """An agent's claim: the run it now holds and the run's token (given to that agent only)."""

    run_id: str
    token: str
    drain: bool = False  # no run: the backend's drain switch is on, or the agent said it drains


def public_view(record: RunRecord | dict[str, Any]) -> dict[str, Any]:
    """A record as the API and the page show it: where it ran as `ran_on`, the job left out (it names paths
    on the server and the bundle's digest, which are the agent's business)."""
    view = dict(record)
    view["ran_on"] = view.pop("backend", None)
    view.pop("job", None)
    if record.get("gpu_usage") is not None:
        view["gpu_use"] = usage_words(record.get("gpu_usage"))
    missing = predates(record)  # an earlier version's record: what it never recorded, said so
    if missing:
        view["predates"] = missing
    return view


def log_from(path: Path, offset: int) -> bytes:
    """A log file's bytes from `offset` on; none when nothing is new (or there is no file yet)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read()
    except FileNotFoundError:
        return b""


def require_backend(config: ProjectConfig, name: str) -> None:
    """NotFound (with the project's backends and the fix) unless the project has this backend."""
    unknown = config.unknown_backend(name)
    if unknown is not None:
        raise NotFound(unknown[0], fix=unknown[1])


class RunService:
    """One project's runs, as every edge asks for them. `enqueue(run_id)` wakes an executor (None where
    nothing is submitted, such as a read-only command)."""

    def __init__(self, config: ProjectConfig, store: RunStore, enqueue: Callable[[str], None] | None = None) -> None:
        self.config, self.store, self.enqueue = config, store, enqueue

    # -- a user's requests --------------------------------------------------------
    def submit(
        self,
        *,
        trainer: str,
        schemas: list[str],
        backend: str | None = None,
        params: dict[str, Any] | None = None,
        **marks: Unpack[RunMarks],
    ) -> RunRecord:
        """Check the request (Conflict, Invalid), write the queued run, wake an executor."""
        if self.enqueue is None:
            raise RuntimeError("this RunService was made without enqueue: it cannot submit")
        return start_run(
            self.config,
            self.store,
            self.enqueue,
            trainer=trainer,
            schemas=schemas,
            backend=backend,
            params=params,
            **marks,
        )

    def retry(self, run_id: str) -> RunRecord:
        """Queue a new run that resumes the failed or cancelled `run_id` from its checkpoints, on its data
        (runs/retry.py); Conflict saying why not."""
        from potato_queue.runs.retry import retry_run

        if self.enqueue is None:
            raise RuntimeError("this RunService was made without enqueue: it cannot submit")
        return retry_run(self.config, self.store, self.enqueue, self.record(run_id))

    def rerun(self, run_id: str, backend: str | None = None) -> RunRecord:
        """Queue an ended run again on its bundle, params and seed (runs/rerun.py), on `backend` or its own."""
        from potato_queue.runs.rerun import rerun_run

        if self.enqueue is None:
            raise RuntimeError("this RunService was made without enqueue: it cannot submit")
        return rerun_run(self.config, self.store, self.enqueue, self.record(run_id), backend)

    def make_rater(self, run_id: str) -> dict[str, Any]:
        """A succeeded run as a machine rater in Potato (runs/rater.py), whatever the project's
        machine_annotator says; Conflict for a run that did not succeed."""
        from potato_queue.runs.rater import become_rater

        record = self.record(run_id)
        if record["state"] != RunState.SUCCEEDED:
            raise Conflict(
                f"Run {run_id} is {record['state']}: only a succeeded run's answers can be a machine rater",
                fix="pick a succeeded run (training runs lists them)",
            )
        rater = become_rater(self.config, self.store, record)
        self.store.update(run_id, machine_annotator=rater)
        return rater

    def remove_rater(self, run_id: str) -> str:
        """Take a run's machine rater out of Potato, every answer of it; the rater's id."""
        from potato_queue.runs.rater import remove_rater

        user = remove_rater(self.config, self.store, self.record(run_id))
        self.store.update(run_id, machine_annotator={"id": user, "removed": True})
        return user

    def strike_usage(self, run_id: str, reason: str) -> dict[str, Any]:
        """Strike an ended run's GPU use from every budget, saying why (runs/budget.py)."""
        from potato_queue.runs.budget import strike_usage

        return strike_usage(self.store, self.record(run_id), reason)

    def record(self, run_id: str) -> RunRecord:
        """The run's record with its live fields (NotFound when the project has no such run)."""
        return self._found(self.store.get, run_id)

    @staticmethod
    def _found(read: Callable[[str], RunRecord], run_id: str) -> RunRecord:
        try:
            return read(run_id)
        except ValueError:  # RunPaths refused it: not a run id at all
            raise NotFound(
                f"No run {run_id!r} in this project (run ids look like 20261129T120000-a1b2c3)", fix=LIST_FIX
            ) from None
        except KeyError:
            raise NotFound(f"No run {run_id!r} in this project", fix=LIST_FIX) from None

    def get(self, run_id: str) -> dict[str, Any]:
        return public_view(self.record(run_id))

    def listed(self, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` runs, newest first (an unreadable one listed as `broken`)."""
        return self.page(limit)[0]

    def page(self, limit: int, before: str | None = None) -> tuple[list[dict[str, Any]], int, str | None]:
        """(the `limit` runs older than run `before`, newest first; how many there are; the next page's
        cursor, None at the oldest run): RunStore.runs_page. NotFound for a `before` that is no run here."""
        try:
            records, total, older = self.store.runs_page(limit, before)
        except KeyError:
            raise NotFound(f"No run {before!r} in this project to list the runs before", fix=LIST_FIX) from None
        return [public_view(record) for record in records], total, older

    def cancel(self, run_id: str) -> RunState:
        """Ask the run to stop (a queued run ends cancelled at once): its state now. Conflict when it had
        already finished."""
        before = self.record(run_id)["state"]
        if before in FINAL_STATES:
            raise Conflict(f"run {run_id} had already finished ({before}); there is nothing to cancel")
        return RunState(self.store.request_cancel(run_id))

    def log(self, run_id: str, offset: int = 0) -> str:
        """run.log from byte `offset` on (to follow it); "" when nothing is new."""
        self.record(run_id)
        return log_from(self.store.paths(run_id).run_log, offset).decode("utf-8", errors="replace")

    def log_on_disk(self, run_id: str, offset: int = 0) -> tuple[bytes, bool]:
        """`training logs`: run.log's bytes from `offset` on, and whether the run had ended when it was read.
        From the run's folder alone, so it needs no Redis. The state is read first: run.log has a run's
        last line before run.json has its end (RunStore.transition), so a read after an end holds it."""
        ended = self._found(self.store.read, run_id)["state"] in FINAL_STATES
        return log_from(self.store.paths(run_id).run_log, offset), ended

    def events(self, run_id: str, after: int = 0) -> list[dict[str, Any]]:
        """The run's events from the `after`-th on."""
        from potato_queue.wire.files import read_jsonl

        self.record(run_id)
        return [event for _, event in read_jsonl(self.store.paths(run_id).events, not_json="skip", missing_ok=True)][
            after:
        ]

    def backend_known(self, name: str) -> None:
        require_backend(self.config, name)

    def check(self, backend: str, llm: ModelAsk | None = None) -> CheckReport:
        """Could a run start on `backend` now (runs/check.py); with `llm`, could hf-llm-lora fine-tune that
        model there. Slow where it asks a host over ssh: call it off the event loop."""
        from potato_queue.runs.check import check_backend

        self.backend_known(backend)
        return check_backend(self.config, self.store, backend, llm)

    # -- an agent's events --------------------------------------------------------
    def claimed(self, backend: str, token: str, agent: dict[str, Any]) -> Claimed | None:
        """An agent of `backend` takes the oldest run offered to it: the run and its token, None when none
        is offered; Denied when the token is not (or no longer) the backend's. The claim is the run's
        first contact."""
        while True:
            run_id = self.store.offers.claim(backend, token, agent)
            if run_id == DENIED:
                raise _token_refused(backend)
            if run_id is None:
                return None
            if run_id == DRAIN:
                return Claimed("", "", drain=True)
            # The token first, then the state: a run that ends from now on revokes the token with its end.
            run_token = self.store.tokens.issue(run_id, CLAIMED_TOKEN_TTL_S)
            if self.store.view(run_id).state == RunState.QUEUED:
                break
            self.store.tokens.revoke(run_id)  # an offer its executor could not withdraw (it died; the run ended)
        self.heard_from(run_id)
        self.store.log(run_id, f"claimed by the agent on {agent.get('host') or 'an unnamed host'} (backend {backend})")
        return Claimed(run_id, run_token)

    def switch_drain(self, backend: str, on: bool) -> dict[str, Any]:
        """The page's and the API's drain switch for an agent backend (Conflict for a backend of another type)."""
        require_backend(self.config, backend)
        if self.config.model_training.backend_config(backend).type != "agent":
            raise Conflict(
                f"Backend {backend} is not an agent backend: only an agent backend's agents claim runs, and drain",
                fix="name an agent backend (type: agent)",
            )
        self.store.offers.switch_drain(backend, on)
        return {"backend": backend, "draining": on, "since": self.store.offers.drain_switched(backend)}

    def agent_waits(self, backend: str, token: str, agent: dict[str, Any], gpu_wait: dict[str, Any]) -> None:
        """An agent of `backend` waits for a free GPU before it claims: the runs offered to the backend say so
        on their step line. Denied when the token is not (or no longer) the backend's."""
        if not self.store.offers.waiting(backend, token, agent, gpu_wait):
            raise _token_refused(backend)

    def heard_from(self, run_id: str) -> None:
        """The run's agent called (its job, bundle, control long-poll, predictions): the heartbeat. The first
        such call is the run's first contact, which the supervising executor turns into `running`."""
        self.store.touch_heartbeat(run_id)


def _token_refused(backend: str) -> Denied:
    return Denied(
        "the token for this backend was refused: it is wrong, or it was replaced by a newer register",
        fix=f"register again: potato-queue training register {backend} CONFIG",
    )
