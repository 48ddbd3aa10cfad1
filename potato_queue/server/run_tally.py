"""What /metrics counts of the project's runs, without reading a year of records on each scrape or server start.

A finished run's share of the figures (its state, backend, wall time, GPU-hours and kWh) never changes, so it is
worked out once and kept: in memory between scrapes, and on disk (store/keys.metrics_tally_path) for the next
server process, which then reads one small file and the records of the runs it does not hold, not every run.json
again. The file is an index, not a record: unreadable or of another shape, it is set aside and rebuilt from the
records.
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from potato_queue.lab.usage import energy_kwh, gpu_hours
from potato_queue.run import FINAL_STATES
from potato_queue.store import RunStore
from potato_queue.store.records import epoch_of
from potato_queue.wire.files import write_atomic

__all__ = ["RunTally", "FinishedRuns", "Share", "share_of", "TALLY_VERSION"]

TALLY_VERSION = 2  # the file's shape; another is rebuilt from the records

# (state, backend, wall seconds of a finished run or None, GPU-hours, kWh)
Share = tuple[str, str, float | None, float, float]


def share_of(record: Mapping[str, Any]) -> Share:
    """A run's share of the figures, from its record."""
    started, ended = epoch_of(record.get("started_at")), epoch_of(record.get("finished_at"))
    wall_s = ended - started if record.get("state") in FINAL_STATES and started and ended else None
    usage = record.get("gpu_usage")
    used = isinstance(usage, dict) and bool(usage.get("gpus"))
    state = record.get("state", "unknown")
    return (
        str(getattr(state, "value", state)),  # a RunState as its value, not its enum name
        str(record.get("backend") or "?"),
        wall_s,
        gpu_hours(usage) if used else 0.0,
        energy_kwh(usage) if used else 0.0,
    )


class RunTally:
    """What /metrics counts of runs: by state and backend, finished runs' wall time, GPU use by backend."""

    def __init__(self) -> None:
        self.states: Counter[tuple[str, str]] = Counter()
        self.durations_s: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.gpu_hours: Counter[str] = Counter()
        self.kwh: Counter[str] = Counter()

    def add(self, share: Share, sign: int = 1) -> None:
        state, backend, wall_s, hours, kwh = share
        self.states[(state, backend)] += sign
        if wall_s is not None:
            self.durations_s[backend] += sign * wall_s
            self.finished[backend] += sign
        if hours or kwh:
            self.gpu_hours[backend] += sign * hours
            self.kwh[backend] += sign * kwh

    def plus(self, records: Iterable[Mapping[str, Any]]) -> RunTally:
        """A copy with `records` added."""
        out = RunTally()
        for mine, theirs in zip(out.counters(), self.counters(), strict=True):
            mine.update(theirs)
        for r in records:
            out.add(share_of(r))
        return out

    def counters(self) -> tuple[Counter[Any], ...]:
        return self.states, self.durations_s, self.finished, self.gpu_hours, self.kwh


class FinishedRuns:
    """The tally of the finished runs, kept between scrapes and, at `path`, between server processes: a scrape
    reads only the runs it has not tallied (new, in flight, broken), never a year of records again."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.tally = RunTally()
        self.counted: dict[str, Any] = {}  # run id: its share, to take it back out when its folder goes
        self.ids: list[str] = []  # the run ids of the last scrape
        self.open: list[str] = []  # ... of those, the runs not finished then
        self.loaded = path is None
        self.lock = threading.Lock()

    def scrape(self, store: RunStore) -> tuple[RunTally, list[Mapping[str, Any]]]:
        """(every run's tally, the records of the runs not finished) now."""
        with self.lock:
            if not self.loaded:
                self._load(store)
            ids = store.run_ids()
            changed = False
            if ids != self.ids:  # a run made or removed since the last scrape: find which
                changed = self._take_out(self.counted.keys() - set(ids))
                self.open = [run_id for run_id in ids if run_id not in self.counted]
                self.ids = ids
            live = []
            for run_id in self.open:
                record = store.listing_record(run_id)
                if record.get("state") in FINAL_STATES:
                    self.counted[run_id] = share_of(record)
                    self.tally.add(self.counted[run_id])
                    changed = True
                else:
                    live.append(record)
            self.open = [r["run_id"] for r in live]
            if changed:
                self._save()
            return self.tally.plus(live), live

    def _take_out(self, gone: set[str]) -> bool:
        """Take the removed runs' shares out; a share the file held spoiled sets the tally back to empty (every
        record is read again)."""
        try:
            shares = [_share(self.counted.pop(run_id)) for run_id in gone]
        except (ValueError, TypeError):
            self.tally, self.counted = RunTally(), {}
            return True
        for share in shares:
            self.tally.add(share, -1)
        return bool(shares)

    def _load(self, store: RunStore) -> None:
        """The file's tally and shares; a share is checked when it is taken out (the tally's totals now)."""
        self.loaded = True
        assert self.path is not None
        try:
            kept = json.loads(self.path.read_text())
            if kept["version"] != TALLY_VERSION or not isinstance(kept["shares"], dict):
                return
            tally = _tally(kept["tally"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return  # none yet, or not ours to trust: the records are read instead
        if sum(tally.states.values()) != len(kept["shares"]):
            return
        self.tally, self.counted = tally, kept["shares"]
        store.vouch_listed(set(self.counted))

    def _save(self) -> None:
        if self.path is None:
            return
        tally = {
            "states": [[state, backend, n] for (state, backend), n in self.tally.states.items() if n],
            **{name: dict(counter) for name, counter in zip(TOTALS, self.tally.counters()[1:], strict=True)},
        }
        text = json.dumps({"version": TALLY_VERSION, "tally": tally, "shares": self.counted}, separators=(",", ":"))
        try:
            write_atomic(self.path, text, durable=False)  # lost in a crash, it is rebuilt from the records
        except OSError:
            pass  # a read-only or full disk: the tally in memory serves, the next process reads the records


TOTALS = ("durations_s", "finished", "gpu_hours", "kwh")  # RunTally's counters after `states`, by backend


def _tally(kept: Any) -> RunTally:
    """The finished runs' tally as the file holds it, checked (ValueError, TypeError: not ours to trust)."""
    out = RunTally()
    for state, backend, n in kept["states"]:
        if state not in FINAL_STATES or not isinstance(backend, str) or not isinstance(n, int) or n < 0:
            raise ValueError(f"not a finished runs' count: {[state, backend, n]!r}")
        out.states[(str(state), backend)] = n
    for name, counter in zip(TOTALS, out.counters()[1:], strict=True):
        for backend, value in kept[name].items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"not a finished runs' total: {name} {backend} {value!r}")
            counter[str(backend)] = value
    return out


def _share(value: Any) -> Share:
    """A share as the file holds it, checked: a bad entry spoils the file (ValueError), not a figure."""
    if isinstance(value, tuple):
        return value  # made by share_of in this process
    state, backend, wall_s, hours, kwh = value
    if state not in FINAL_STATES or not isinstance(backend, str):
        raise ValueError(f"not a finished run's share: {value!r}")
    numbers = [float(x) for x in (hours, kwh, 0.0 if wall_s is None else wall_s)]
    if not all(math.isfinite(x) for x in numbers) or min(numbers[:2]) < 0:
        raise ValueError(f"not a finished run's share: {value!r}")
    return (str(state), backend, None if wall_s is None else float(wall_s), float(hours), float(kwh))
