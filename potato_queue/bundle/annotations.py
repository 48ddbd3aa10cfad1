"""Stage 1 of a bundle build, the annotators' half: every annotator's answers, read on two cores when it pays.

Each annotator's <output_annotation_dir>/<user>/user_state.json is read by user_state.py (both of Potato's
encodings, as Potato's `training/dataset.py` reads them) and kept here per annotator and scheme as {item:
answer}. Reading is most of a large project's build (json-parsing the files, then one Python pass over every
answer) and the files are independent, so when they are large and a second core is free a forked child reads
about half of them (by size) while this process reads the rest and the items (docs/decisions.md, "A large
project is read on two cores"). Equal answers are one shared object, so the child's half comes back through a
pipe as one small pickle.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import warnings
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from potato_queue.bundle.user_state import FileAnswers, is_machine_state, is_our_rater, read_state, read_user_state
from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.schemes import stored_under

__all__ = [
    "Annotations",
    "PARALLEL_FROM_BYTES",
    "annotator_files",
    "answered_ids",
    "count_annotations",
    "no_cycle_collection",
    "read_annotations",
]

#: Below this many bytes of annotators' files a fork costs more than the second core saves.
PARALLEL_FROM_BYTES = 8_000_000


@dataclass
class Annotations:
    """The answers to some schemes: annotators in first-seen order (folder order; one with no answer counts),
    each one's {item: answer} per scheme, every item answered in any scheme, and how many records were read."""

    users: list[str] = field(default_factory=list)
    by_user: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    n_records: int = 0
    orders: dict[str, dict[str, dict[str, list[int]]]] = field(default_factory=dict)  # user: FileAnswers.orders

    def of(self, schema: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """(user, {item: answer}) for one scheme, users in first-seen order."""
        for user in self.users:
            yield user, self.by_user.get(user, {}).get(schema, {})


def annotator_files(config: ProjectConfig) -> list[tuple[str, Path]]:
    """Each annotator's (folder name, user_state.json), the folders in sorted order (it decides ties); a folder
    without one (training/) is no annotator, nor is a machine rater potato-queue wrote (is_our_rater). Another
    machine rater's file is listed, and read_user_state leaves its answers out."""
    out = config.output_path
    return [
        (entry, out / entry / "user_state.json")
        for entry in (sorted(os.listdir(out)) if out.is_dir() else [])
        if not is_our_rater(entry) and (out / entry / "user_state.json").is_file()
    ]


@contextlib.contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Reading a project makes millions of small dicts and lists and no reference cycles: Python's cycle
    collector, woken by every 700 of them, walks all the live ones each time (two thirds of a 100,000-item
    project's parse time). Paused while it reads, as it was before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _merge(parts: list[FileAnswers]) -> Annotations:
    """The files' parts in folder order, as one index keyed by (user, item) would hold them: a second folder with
    the same user id replaces that user's record of an item whole."""
    found = Annotations()
    for part in parts:
        found.n_records += part.n_records
        if not part.user:
            continue
        if part.has_record and part.user not in found.users:
            found.users.append(part.user)
        found.answered.update(part.answered)
        for schema, orders in part.orders.items():
            found.orders.setdefault(part.user, {}).setdefault(schema, {}).update(orders)
        mine = found.by_user.get(part.user)
        if mine is None:
            found.by_user[part.user] = part.by_scheme
            continue
        for answers in mine.values():
            for iid in part.answered:
                answers.pop(iid, None)
        for schema, answers in part.by_scheme.items():
            mine.setdefault(schema, {}).update(answers)
    return found


def _image_schemas(config: ProjectConfig) -> set[str]:
    return {str(s.get("name")) for s in config.annotation_schemes if s.get("annotation_type") == "image_annotation"}


def _halves(files: list[tuple[str, Path]], head_start_bytes: int) -> tuple[set[int], int]:
    """The positions of the files the child reads (about half of all bytes, this side starting with the items'),
    and the bytes of every annotator's file."""
    sizes = []
    for position, (_, path) in enumerate(files):
        try:
            sizes.append((path.stat().st_size, position))
        except OSError:
            sizes.append((0, position))
    mine, theirs, child = head_start_bytes, 0, set()
    for size, position in sorted(sizes, reverse=True):
        if theirs < mine:
            theirs += size
            child.add(position)
        else:
            mine += size
    return child, sum(size for size, _ in sizes)


def read_annotations(
    config: ProjectConfig,
    schemas: Collection[str] | None = None,
    while_reading: Callable[[], Any] | None = None,
    parallel_from_bytes: int | None = None,
) -> tuple[Annotations, Any]:
    """The answers to `schemas` (None: every scheme), and what `while_reading()` returned: the caller's own
    work (the items), done here while a child reads its half of the annotators' files (from
    `parallel_from_bytes` of them, by default PARALLEL_FROM_BYTES)."""
    parallel_from_bytes = PARALLEL_FROM_BYTES if parallel_from_bytes is None else parallel_from_bytes
    files, images = annotator_files(config), _image_schemas(config)
    wanted = set(schemas) if schemas is not None else None
    head_start = sum(p.stat().st_size for p in config.data_paths() if p.is_file()) if while_reading else 0
    theirs, total = _halves(files, head_start)
    if total < parallel_from_bytes or _cores() < 2:
        theirs = set()
    with (
        no_cycle_collection(),
        _Child(
            lambda: [read_user_state(*files[n], wanted, images) for n in sorted(theirs)], enabled=bool(theirs)
        ) as child,
    ):
        extra = while_reading() if while_reading else None
        mine = {n: read_user_state(*files[n], wanted, images) for n in range(len(files)) if n not in theirs}
        mine.update(zip(sorted(theirs), child.result(), strict=True))
        return _merge([mine[n] for n in range(len(files))]), extra


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class _Child:
    """`work()` in a forked child, its result (or its PotatoQueueError) back through a pipe; inline when not
    enabled. The child only computes and leaves with os._exit: no handler, lock or thread of this process runs
    in it; a child whose result is not collected is killed and reaped on exit."""

    def __init__(self, work: Callable[[], Any], enabled: bool) -> None:
        self._work, self._pid, self._read_fd = work, 0, -1
        self._value: Any = None
        if not enabled:
            self._value = work()
            return
        self._read_fd, write_fd = os.pipe()
        with warnings.catch_warnings():  # 3.12+ warns of fork in a threaded process; the child runs no thread's code
            warnings.simplefilter("ignore", DeprecationWarning)
            self._pid = os.fork()
        if self._pid == 0:
            self._serve(write_fd)
        os.close(write_fd)

    def _serve(self, write_fd: int) -> None:
        code = 0
        try:
            os.close(self._read_fd)
            try:
                payload: tuple[str, Any] = ("ok", self._work())
            except PotatoQueueError as exc:
                payload = ("error", (exc.message, exc.fix))
            except Exception as exc:  # noqa: BLE001 - said in the parent, where it can be raised
                payload = ("crash", f"{type(exc).__name__}: {exc}")
            with os.fdopen(write_fd, "wb") as fh:
                pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:  # noqa: BLE001 - nothing may escape a forked child
            code = 1
        finally:
            os._exit(code)

    def result(self) -> Any:
        if not self._pid:
            return self._value
        with os.fdopen(self._read_fd, "rb") as fh:
            data = fh.read()
        self._read_fd = -1
        os.waitpid(self._pid, 0)
        self._pid = 0
        kind, value = pickle.loads(data) if data else ("crash", "the reading process ended without a result")
        if kind == "error":
            raise PotatoQueueError(value[0], fix=value[1])
        if kind == "crash":
            raise RuntimeError(f"reading the annotators' files failed: {value}")
        return value

    def __enter__(self) -> _Child:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pid:  # the caller failed before collecting: nothing is left running
            with contextlib.suppress(OSError):
                os.kill(self._pid, 9)
            os.waitpid(self._pid, 0)
        if self._read_fd >= 0:
            os.close(self._read_fd)


def count_annotations(config: ProjectConfig, schemas: Collection[str]) -> int:
    """How many (annotator, item) answers name one of `schemas` (a multirate row's: its multirate's):
    auto-retrain's measure of new work."""
    by_name = {str(s.get("name")): s for s in config.annotation_schemes}
    found, _ = read_annotations(config, {stored_under(by_name[n]) if n in by_name else n for n in schemas})
    return sum(len(set().union(*by_scheme.values())) for by_scheme in found.by_user.values())


def answered_ids(config: ProjectConfig) -> set[str]:
    """The items someone has answered: read_annotations' items without their answers (a file at a time, only
    the ids kept), what the insight leaves out of "what to label next"."""
    blobs = []
    with no_cycle_collection():
        for _, path in annotator_files(config):
            state = read_state(path)
            if is_machine_state(state):
                continue  # a declared machine rater's answers are no one's labelling
            # One string per file, so that nothing of the parsed file outlives it: the long-running server
            # gives its memory back (ids kept one by one would pin the parse's memory pages).
            blobs.append(
                "\n".join(
                    str(iid)
                    for key in ("instance_id_to_label_to_value", "instance_id_to_span_to_value")
                    for iid, raw in (state.get(key) or {}).items()
                    if raw
                )
            )
            del state
    return {iid for blob in blobs for iid in blob.split("\n") if iid}
