"""The project's run ids as the run folders hold them, oldest first, without rereading a year of history.

Listing the runs folder is the truth (Redis may have been emptied), but a project that retrains on a schedule
has thousands of folders, and the page asks for its newest runs twice a second. So the sorted ids are kept
between calls and the folder is listed again only when its mtime moved (a run folder made or removed), or,
on a filesystem with coarse timestamps (whole seconds, or FAT's two), while that mtime is too recent to trust:
two changes within one tick get the same mtime there. A folder without its run.json yet (a run being created)
is looked at again on each call until it has one; a caller may vouch for folders it read a record in
(RunListing.vouch), which the first listing then takes without a look. A run id starts with its creation second
(`20261207T164634-4f35aa`); only runs made within the same second need their run.json's `created_at`
(milliseconds) to be ordered.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path

from potato_queue.store.keys import RUN_ID_RE

__all__ = ["RunListing", "ID_SECOND_CHARS", "MTIME_TRUST_S"]

ID_SECOND_CHARS = 15  # `20261207T164634`: a run id's creation second
MTIME_TRUST_S = 2.0  # the coarsest directory mtime in use (FAT's 2 s): an mtime older than this is final


class RunListing:
    """The run ids in `folder` that have a run.json, oldest first; `created_at(run_id)` orders a second's ties."""

    def __init__(self, folder: Path, created_at: Callable[[str], str], now_s: Callable[[], float]) -> None:
        self.folder = folder
        self.created_at = created_at
        self.now_s = now_s  # the store's clock: a directory's mtime is compared with it
        self._mtime_ns: int | None = None
        self._listed_at_s = 0.0
        self._names: set[str] = set()
        self._waiting: set[str] = set()  # folders without their run.json yet
        self._known: set[str] = set()  # folders a caller has seen a record in (vouch): not looked into again
        self._sorted: list[str] = []

    def vouch(self, names: set[str]) -> None:
        """These folders held a run.json when the caller read them (a finished run's record, say): the first
        listing takes them as runs without a stat of each, which at 20,000 runs is most of its cost."""
        self._known |= names

    def ids(self) -> list[str]:
        """Every run id, oldest first (a copy: the caller may keep it)."""
        try:
            mtime_ns = self.folder.stat().st_mtime_ns
        except FileNotFoundError:
            return []
        if mtime_ns != self._mtime_ns or self._coarse(mtime_ns):
            self._relist(mtime_ns)
        elif self._waiting:
            self._settle()
        return list(self._sorted)

    def _coarse(self, mtime_ns: int) -> bool:
        """Whether an unchanged mtime may still hide a change: it is recent and on a whole second (a filesystem
        that keeps nanoseconds, as ext4, xfs, btrfs and tmpfs do, almost never lands on one)."""
        return mtime_ns % 1_000_000_000 == 0 and self._listed_at_s - mtime_ns / 1e9 < MTIME_TRUST_S

    def _relist(self, mtime_ns: int) -> None:
        self._listed_at_s = self.now_s()
        entries = set(os.listdir(self.folder))
        self._mtime_ns = mtime_ns
        added = {name for name in entries - self._names if RUN_ID_RE.fullmatch(name)}  # only new names matched
        names = (self._names & entries) | added
        if names == self._names:
            self._settle()
            return
        self._names = names
        vouched = added & self._known
        self._known.clear()
        self._waiting = (self._waiting & names) | (added - vouched)
        self._sorted = [name for name in self._sorted if name in names]  # a removed folder leaves the list
        self._settle(vouched)

    def _settle(self, vouched: set[str] | None = None) -> None:
        """Add the waiting folders that have their run.json now (and the vouched ones), in order."""
        folder = str(self.folder)
        ready = {name for name in self._waiting if os.path.exists(f"{folder}/{name}/run.json")} | (vouched or set())
        if not ready:
            return
        self._waiting -= ready
        fresh = self._ordered(sorted(ready))
        if not self._sorted or fresh[0][:ID_SECOND_CHARS] > self._sorted[-1][:ID_SECOND_CHARS]:
            self._sorted += fresh  # the common case: new runs, newer than every run listed
        else:
            self._sorted = self._ordered(self._sorted + fresh)

    def _ordered(self, ids: list[str]) -> list[str]:
        """By creation second, then, within a second shared by several runs, by run.json's created_at."""
        ids.sort()  # the creation second first, then the random tail (C's sort: 20,000 ids in a few ms)
        if len({run_id[:ID_SECOND_CHARS] for run_id in ids}) == len(ids):
            return ids  # no second shared: nothing to read
        out: list[str] = []
        for _, same in itertools.groupby(ids, key=lambda run_id: run_id[:ID_SECOND_CHARS]):
            group = list(same)
            out += sorted(group, key=self.created_at) if len(group) > 1 else group
        return out
