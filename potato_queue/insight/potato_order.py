"""Handing what to label next to Potato: its `priority` assignment strategy, fed through the data file.

Potato 2.12 keeps no stored ranking it would take from outside: its `priority` strategy serves the
items with the highest `triage_priority` first, and computes that once per item, when it loads its data
files, from the field its `triage.signal_field` names in the item's record. So the order goes into the
data files: each ranked item gets PRIORITY_FIELD (the list's length down to 1: the top item highest),
every other item loses it, nothing else of the file changes (a JSON-lines file keeps every line it does
not change byte for byte), and the file is replaced in one rename with its own mode; its temp file lies in
potato-queue's staging folder (never among the files Potato reads), and one a killed server left there is
removed at the next start or write. Nothing is written when Potato's config would not serve the order.
Potato reads it at its next start.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from potato_queue.bundle.read import read_items
from potato_queue.config import ProjectConfig
from potato_queue.errors import Conflict
from potato_queue.store.keys import staging_dir
from potato_queue.wire.files import STAGED_RE, write_atomic

__all__ = ["PRIORITY_FIELD", "POTATO_ORDER_KEYS", "order_problem", "write_order", "hand_to_potato", "clear_staging"]

PRIORITY_FIELD = "potato_queue_priority"
# The keys of Potato's config that make it serve items by PRIORITY_FIELD, highest first.
POTATO_ORDER_KEYS: dict[str, Any] = {
    "assignment_strategy": "priority",
    "triage": {"enabled": True, "signal_field": PRIORITY_FIELD, "order": "desc", "default_priority": 0},
}
_INDENT = re.compile(r"^[\[{]\r?\n([ \t]+)")


def order_problem(config: ProjectConfig) -> str | None:
    """Why Potato would not serve the written order (with the keys to add), or None."""
    extra = config.model_extra or {}
    triage = extra.get("triage") if isinstance(extra.get("triage"), dict) else {}
    wrong = [
        why
        for why, bad in (
            ("assignment_strategy is not priority", extra.get("assignment_strategy") != "priority"),
            ("triage is not enabled", triage.get("enabled") is not True),
            (f"triage.signal_field is not {PRIORITY_FIELD}", triage.get("signal_field") != PRIORITY_FIELD),
            ("triage.order is not desc", triage.get("order", "desc") != "desc"),
            ("triage.invert_signal turns the order round", bool(triage.get("invert_signal"))),
            ("triage.rules come before signal_field in Potato", bool(triage.get("rules"))),
            (
                "triage.default_priority puts unranked items level with or above ranked ones",
                _number(triage.get("default_priority", 0)) >= 1,
            ),
        )
        if bad
    ]
    if not wrong:
        return None
    return (
        f"Potato serves this order only with these keys in {config.config_path} (then restart Potato): "
        "assignment_strategy: priority; triage: {enabled: true, signal_field: "
        + PRIORITY_FIELD
        + ", order: desc, default_priority: 0} and no triage rules or invert_signal; now "
        + "; ".join(wrong)
    )


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _rewrite_json(text: str, payload: Any, priority: dict[str, int], id_key: str) -> tuple[str, int]:
    items = payload if isinstance(payload, list) else [payload]
    changed = sum(_set(item, priority, id_key) for item in items if isinstance(item, dict))
    found = _INDENT.match(text)
    indent: str | None = found.group(1) if found else None
    return json.dumps(payload, ensure_ascii=False, indent=indent) + ("\n" if text.endswith("\n") else ""), changed


def _rewrite_lines(text: str, priority: dict[str, int], id_key: str) -> tuple[str, int]:
    out, changed = [], 0
    for line in text.splitlines(keepends=True):
        try:
            item = json.loads(line) if line.strip() else None
        except ValueError:
            item = None
        if isinstance(item, dict) and _set(item, priority, id_key):
            changed += 1
            line = json.dumps(item, ensure_ascii=False) + ("\n" if line.endswith("\n") else "")
        out.append(line)
    return "".join(out), changed


def _set(item: dict[str, Any], priority: dict[str, int], id_key: str) -> bool:
    """Give an item its priority, or take an old one away; whether it changed."""
    want = priority.get(str(item.get(id_key)))
    if item.get(PRIORITY_FIELD) == want:
        return False
    if want is None:
        del item[PRIORITY_FIELD]
    else:
        item[PRIORITY_FIELD] = want
    return True


def _new_text(path: Path, priority: dict[str, int], id_key: str) -> tuple[str, int]:
    """The data file with the order in it, and how many items changed; Conflict when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Conflict(
            f"data file {path} cannot be read ({exc}), so the order was not written",
            fix="restore the file, or correct data_files in the config",
        ) from None
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, (list, dict)):
        return _rewrite_json(text, payload, priority, id_key)
    return _rewrite_lines(text, priority, id_key)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another account's process
    return True


def clear_staging(config: ProjectConfig) -> list[str]:
    """Remove the temp files of writers that died mid-write (a server killed while it wrote the order):
    at every server start and before every write. The names removed."""
    folder = staging_dir(config)
    removed = []
    try:
        for path in folder.iterdir() if folder.is_dir() else ():
            found = STAGED_RE.fullmatch(path.name)
            if found and not _alive(int(found.group(1))):
                path.unlink(missing_ok=True)
                removed.append(path.name)
    except OSError:
        pass  # housekeeping: a folder this account cannot read is not a reason to refuse a start or a write
    return removed


def _replace(config: ProjectConfig, real: Path, new: str) -> None:
    """The data file replaced in one rename; its temp file in potato-queue's staging folder, not beside it."""
    data, mode = new.encode("utf-8"), os.stat(real).st_mode & 0o777
    staging = staging_dir(config)
    staging.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        write_atomic(real, data, mode=mode, staging=staging)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        write_atomic(real, data, mode=mode)  # a data file on another filesystem: its temp file beside it


def write_order(config: ProjectConfig, ranked_ids: Sequence[str]) -> dict[str, Any]:
    """Write the ranking into the project's data files (every file's new text made before any is replaced;
    a linked file is written where it points; one whose text would not change is not written):
    {"files": changed files, "items": changed items}."""
    priority = {iid: len(ranked_ids) - n for n, iid in enumerate(ranked_ids)}
    id_key = config.item_properties.id_key
    changes = []
    for path in config.data_paths():
        real = Path(os.path.realpath(path))
        new, changed = _new_text(real, priority, id_key)
        if changed:
            changes.append((real, new, changed))
    clear_staging(config)
    for real, new, _changed in changes:
        try:
            _replace(config, real, new)
        except OSError as exc:
            raise Conflict(
                f"data file {real} cannot be written ({exc}); the order is written only in part",
                fix="make the data files writable by the account potato-queue runs as, then send it again",
            ) from None
    return {
        "files": [str(real) for real, _, _ in changes],
        "items": sum(c for _, _, c in changes),
        "ranked": len(ranked_ids),
    }


def hand_to_potato(config: ProjectConfig, ranked_ids: Sequence[str]) -> dict[str, Any]:
    """write_order, and what to tell the admin: what changed and the restart; Conflict, with nothing
    written, when Potato's config would not serve the order (the keys it lacks)."""
    problem = order_problem(config)
    if problem is not None:
        raise Conflict(
            f"The order was not written into the data files: {problem}",
            fix="add those keys to Potato's config, then send the order again",
        )
    written = write_order(config, ranked_ids)
    if ranked_ids and not written["items"] and not _has_field(config, ranked_ids[0]):
        problem = (
            "no data file holds the ranked items as JSON records (Potato's priority reads a field of the "
            "item's JSON record; a CSV or TSV data file cannot carry it)"
        )
    said = (
        f"wrote the order of {written['ranked']} items into the data files ({written['items']} items changed in "
        f"{len(written['files'])} file(s)); restart Potato: it reads the order when it loads its items"
    )
    return {**written, "problem": problem, "said": said + (f"\nwarning: {problem}" if problem else "")}


def _has_field(config: ProjectConfig, instance_id: str) -> bool:
    """Whether an item already carries its priority (an order sent twice changes nothing)."""
    return PRIORITY_FIELD in (read_items(config).get(instance_id) or {})
