"""Could a run start on a backend now: `training check` and the page's Check button, one use case.

A push backend's executor asks its machine (executors.base.Executor.check); a pull backend's machine
comes to us, so what can be known of it is in the store: its registration, when an agent last asked
for work, and what that agent said of itself (AGT-3). Whether hf-llm-lora fits a model is asked here,
of the facts an executor reported (host/llm_fit.py), so that no executor knows a trainer.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import redis

from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.executors import build_executor
from potato_queue.executors.base import CheckReport
from potato_queue.host.llm_fit import ModelAsk, fit_of_facts
from potato_queue.settings import REDIS_URL_ENV
from potato_queue.store import RunStore

__all__ = ["check_backend", "registration_report", "unexpected_report", "with_llm_fit", "RECENT_S"]

# An agent long-polls every ~25 s: one not seen for this long is not polling now.
RECENT_S = 90.0


def check_backend(config: ProjectConfig, store: RunStore, backend: str, llm: ModelAsk | None = None) -> CheckReport:
    """The report for one backend of the project (the caller checked the name); with `llm`, whether
    hf-llm-lora can fine-tune that model there too."""
    executor = build_executor(config, backend)
    try:
        if executor.pull:
            return registration_report(store, backend, str(config.config_path))
        report = executor.check(llm.model_name if llm is not None else None)
    except Exception as exc:  # noqa: BLE001 - the check's answer is a report, for the CLI and the page alike
        return unexpected_report(backend, exc)
    finally:
        executor.close()
    return report if llm is None else with_llm_fit(report, llm)


def unexpected_report(backend: str, exc: Exception) -> CheckReport:
    """A check that failed in a way its executor did not foresee (no ssh client on this machine, a host whose
    answer is not JSON), or Redis gone for an agent backend's: the report says what happened, for the CLI
    and the page alike, instead of a traceback or an error page."""
    if isinstance(exc, PotatoQueueError):
        return CheckReport.failed(f"the check of {backend} failed: {exc.message}", exc.fix)
    return CheckReport.failed(f"the check of {backend} failed: {type(exc).__name__}: {exc}", None)


def with_llm_fit(report: CheckReport, llm: ModelAsk) -> CheckReport:
    """The report with hf-llm-lora's fit on the GPUs a run may get, from the executor's `llm_facts`."""
    facts = report.data.get("llm_facts")
    if facts is None:  # the host could not be asked: the report says why
        return report
    fits, lines = fit_of_facts(llm, facts)
    data = {**report.data, "llm": {"fits": fits, "lines": lines}}
    return CheckReport(ok=report.ok and fits, lines=[*report.lines, *lines], data=data)


def registration_report(store: RunStore, backend: str, config_path: str) -> CheckReport:
    """AGT-3: an agent backend's registration; ok only when an agent asked for work within RECENT_S."""
    try:
        registration, switched = store.agents.registration(backend), store.offers.drain_switched(backend)
    except redis.RedisError:
        return unexpected_report(
            backend,
            PotatoQueueError(
                f"Redis does not answer, and backend {backend}'s registration is kept there",
                fix=f"start Redis, or point --redis-url (or {REDIS_URL_ENV}) at the server's",
            ),
        )
    if registration is None:
        command = f"potato-queue training register {backend} {config_path}"
        return CheckReport(
            ok=False,
            lines=[
                f"{backend}: no token issued yet",
                f"  issue one with: {command}",
                *_drain_lines(backend, switched, None, store.clock.now_s()),
            ],
            data={"backend": backend, "registered": False, "register_command": command, "drain_switched": switched},
        )
    now_s = store.clock.now_s()
    agent: dict[str, Any] = registration["agent"] or {}
    last_seen = registration["last_seen"]
    recent = last_seen is not None and now_s - last_seen < RECENT_S
    lines = [
        f"{backend}: token issued {_when(registration['created_at'], now_s)}",
        f"  last_seen: {_when(last_seen, now_s)}",
    ]
    if agent:
        packages = ", ".join(f"{k} {v}" for k, v in sorted((agent.get("packages") or {}).items())) or "none found"
        lines.append(
            f"  agent: {agent.get('host')}, Python {agent.get('python')} ({agent.get('executable')}); "
            f"trainer packages: {packages}"
        )
    draining = registration.get("draining")
    lines += _drain_lines(backend, switched, draining, now_s)
    if not recent:
        lines.append(
            "  no agent is polling now: start one on the training machine "
            f"(potato-queue training agent --server URL --backend {backend})"
        )
    data = {
        "backend": backend,
        "registered": True,
        "created_at": registration["created_at"],
        "last_seen": last_seen,
        "agent": agent or None,
        "polling": recent,
        "drain_switched": switched,
        "draining": draining,
    }
    return CheckReport(ok=recent, lines=lines, data=data)


def _drain_lines(backend: str, switched: float | None, draining: dict[str, Any] | None, now_s: float) -> list[str]:
    """The server's drain switch and an agent's word that it drains, as `training check` says them."""
    lines = []
    if switched is not None:
        lines.append(
            f"  draining: switched on {_when(switched, now_s)}: its agents finish their run and claim no new one "
            f"(switch it off on the Training page, or DELETE .../backends/{backend}/drain)"
        )
    if draining:
        lines.append(
            f"  agent {draining.get('host')} (pid {draining.get('pid')}) said it drains at {_when(draining['at'], now_s)}: "
            "it finishes its run, claims none, then exits (until an agent claims again)"
        )
    return lines


def _when(epoch_s: float | None, now_s: float) -> str:
    if epoch_s is None:
        return "never"
    moment = datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    return f"{moment} ({now_s - epoch_s:.0f} s ago)"
