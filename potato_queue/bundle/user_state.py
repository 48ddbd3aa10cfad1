"""One annotator's user_state.json, read as Potato's `training/dataset.py` reads it: both of Potato's encodings
(label lists and the older label maps), spans, image shapes, kept per wanted scheme as {item: answer}.

Apart from annotations.py (the project's annotators: which files, half of them in a forked child on a large
project, merged into one Annotations) because this is Potato's file format alone, one file at a time: what a
change of Potato's encoding touches, and the loop most of a large project's reading time is spent in.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from potato_queue.bundle.read import Answers
from potato_queue.errors import PotatoQueueError

__all__ = ["FileAnswers", "RATER_PREFIX", "is_machine_state", "is_our_rater", "read_state", "read_user_state"]


@dataclass
class FileAnswers:
    """One user_state.json's part: the user, whether any record names an item, the items answered in file order,
    and per wanted scheme {item: answer}."""

    user: str
    has_record: bool
    answered: list[str]
    by_scheme: dict[str, dict[str, Any]]
    n_records: int
    # Per wanted scheme, {item: the order its candidates were shown in} where Potato recorded one (a pairwise
    # scheme with randomize_order): which pair member an answer "A" means.
    orders: dict[str, dict[str, list[int]]] = field(default_factory=dict)


def read_state(path: Path) -> Mapping[str, Any]:
    """One user_state.json parsed ({} when its top level is no mapping); a PotatoQueueError with its fix when
    it cannot be read as JSON."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PotatoQueueError(
            f"{path} cannot be read as JSON ({exc})",
            fix="restore it from a backup, or move that annotator's folder aside",
        ) from None
    return state if isinstance(state, dict) else {}


# The folders of the machine raters potato-queue writes (runs/rater.py): <prefix><trainer>.<schemes>.
RATER_PREFIX = "potato-queue."


def is_our_rater(folder: str) -> bool:
    """Whether an output folder is a machine rater potato-queue wrote: known by its name, so that listing the
    annotators needs no file read (its writes then change no bundle's inputs)."""
    return folder.startswith(RATER_PREFIX)


def is_machine_state(state: Mapping[str, Any]) -> bool:
    """Whether a user state is a machine rater's, by Potato's rule (potato/annotator_origin.py): an absent or
    empty `origin` is a person, and so is one whose kind is "human"; any other origin, readable or not, is a
    machine. A machine's answers are no annotator's: never a training label, a vote or new work to count."""
    origin = state.get("origin")
    if origin is None or origin == {}:
        return False
    return not (isinstance(origin, Mapping) and origin.get("kind") == "human")


def _label_maps(raw: Any) -> Answers:
    """Both encodings as {schema: {label: value}}: [[{schema, name}, value], ...] or the older dict."""
    if isinstance(raw, dict):
        return raw
    maps: Answers = {}
    for entry in raw if isinstance(raw, list) else []:
        if isinstance(entry, (list, tuple)) and len(entry) == 2:
            label, value = entry
            if isinstance(label, dict):
                maps.setdefault(label.get("schema", ""), {})[label.get("name", "")] = value
            else:
                maps.setdefault(str(label), {})[""] = value
    return maps


def _span_lists(raw: Any) -> dict[str, list[Any]]:
    """{schema: [span, ...]} from the list encoding ([span, value] pairs) or the older dict."""
    spans: dict[str, list[Any]] = {}
    for entry in raw if isinstance(raw, list) else []:
        span = entry[0] if isinstance(entry, (list, tuple)) and len(entry) == 2 else entry
        if isinstance(span, dict):
            spans.setdefault(span.get("schema", ""), []).append(span)
    for schema, found in (raw if isinstance(raw, dict) else {}).items():
        if isinstance(found, (list, dict)):
            spans[schema] = found if isinstance(found, list) else list(found.values())
    return spans


def _image_objects(maps: Answers, image_schemas: set[str]) -> dict[str, list[Any]]:
    """An image_annotation scheme keeps its shapes as a list (or its JSON text) in a label value."""
    found: dict[str, list[Any]] = {}
    for schema in image_schemas & set(maps):
        for value in maps[schema].values() if isinstance(maps[schema], dict) else []:
            try:
                value = json.loads(value) if isinstance(value, str) else value
            except json.JSONDecodeError:
                continue
            if isinstance(value, list):
                found[schema] = value
    return found


def _user_records(state: Mapping[str, Any], image_schemas: set[str]) -> Iterator[tuple[str, Answers]]:
    """(instance id, answers) for every instance one user state mentions."""
    labels = state.get("instance_id_to_label_to_value") or {}
    spans = state.get("instance_id_to_span_to_value") or {}
    for iid in {**dict.fromkeys(labels), **dict.fromkeys(spans)} if spans else labels:
        maps = _label_maps(labels.get(iid, {}))
        if not (spans or image_schemas):  # most projects: label maps alone (a large one's time is here)
            yield str(iid), maps
            continue
        answers = dict(maps)  # spans, then image shapes, replace a label map of the same scheme
        answers.update({s: {"_spans": found} for s, found in _span_lists(spans.get(iid, [])).items()})
        answers.update({s: {"_objects": found} for s, found in _image_objects(maps, image_schemas).items()})
        yield str(iid), answers


def read_user_state(entry: str, path: Path, schemas: Collection[str] | None, image_schemas: set[str]) -> FileAnswers:
    """One annotator's answers to `schemas` (None: every scheme), equal flat answers shared."""
    state = read_state(path)
    if is_machine_state(state):
        return FileAnswers("", False, [], {}, 0)  # no user: _merge leaves it out
    part = FileAnswers(str(state.get("user_id", entry)), False, [], {}, 0)
    _read_orders(state.get("instance_id_to_presentation_order"), schemas, part)
    labels = state.get("instance_id_to_label_to_value") or {}
    if (
        schemas is not None
        and not image_schemas
        and not state.get("instance_id_to_span_to_value")
        and isinstance(labels, dict)
    ):
        _read_label_lists(labels, schemas, part)
        return part
    shared: dict[tuple[Any, ...], Any] = {}
    for iid, answers in _user_records(state, image_schemas):
        part.n_records += 1
        if not iid:
            continue
        part.has_record = True
        if not answers:
            continue
        part.answered.append(iid)
        for schema, value_map in answers.items():
            if schemas is None or schema in schemas:
                _keep(part, schema, iid, value_map, shared)
    return part


def _read_orders(raw: Any, schemas: Collection[str] | None, part: FileAnswers) -> None:
    """The shown orders Potato recorded ({item: {scheme: [source index, ...]}}) of the wanted schemes."""
    for iid, orders in raw.items() if isinstance(raw, dict) else ():
        for schema, order in orders.items() if isinstance(orders, dict) else ():
            if (schemas is None or schema in schemas) and isinstance(order, list):
                part.orders.setdefault(schema, {})[str(iid)] = order


def _keep(part: FileAnswers, schema: str, iid: str, value_map: Any, shared: dict[tuple[Any, ...], Any]) -> None:
    if type(value_map) is dict:
        try:  # typed: 1, 1.0 and True are equal keys but different answers
            value_map = shared.setdefault((tuple(value_map.items()), tuple(map(type, value_map.values()))), value_map)
        except TypeError:
            pass  # a list or a map inside (spans, shapes): its own object
    part.by_scheme.setdefault(schema, {})[iid] = value_map


def _read_label_lists(labels: dict[str, Any], schemas: Collection[str], part: FileAnswers) -> None:
    """_user_records and _label_maps fused for the common file (label lists, no spans or shapes), keeping only
    the answers to `schemas`: most of a large project's reading time is this loop."""
    shared: dict[tuple[Any, ...], Any] = {}
    part.n_records = len(labels)
    for iid, raw in labels.items():
        iid = str(iid)
        if not iid:
            continue
        part.has_record = True
        if type(raw) is not list:  # the older dict encoding
            answers = _label_maps(raw)
            if answers:
                part.answered.append(iid)
            for schema in schemas & answers.keys():
                _keep(part, schema, iid, answers[schema], shared)
            continue
        valid = False
        mine: dict[str, dict[str, Any]] | None = None
        for entry in raw:
            if type(entry) in (list, tuple) and len(entry) == 2:
                valid, label = True, entry[0]
                schema = label.get("schema", "") if type(label) is dict else str(label)
                if schema in schemas:
                    mine = mine if mine is not None else {}
                    mine.setdefault(schema, {})[label.get("name", "") if type(label) is dict else ""] = entry[1]
        if valid:
            part.answered.append(iid)
            for schema, value_map in (mine or {}).items():
                _keep(part, schema, iid, value_map, shared)
