"""Stage 2 of a bundle build: merging several annotators' answers into one reference.

Per item and scheme one agreed answer, by Potato's Dawid-Skene EM
(aggregation "consensus", with two annotators or more) or else exact-match
majority, the same float operations and tie-breaks as Potato's; then the
training target of each agreed answer by schema kind, and the labels seen.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Sequence
from itertools import chain, repeat
from typing import Any

import numpy as np

from potato_queue.bundle.annotations import Annotations
from potato_queue.bundle.dawid_skene import dawid_skene_arrays
from potato_queue.bundle.read import Answers
from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError

# What the other stages of the bundle use; the rest is this stage's own.
__all__ = ["all_targets", "answered_items", "no_labels_error", "pick_answers", "resolve_references"]

_UNSET = (None, "", False, 0, "false")  # Potato's "not selected"; the string "0" is a selection


class _Canonical:
    """The exact-match key of one answer (Potato's sorted JSON of it, which orders the classes), and the answer
    as a map; worked out once per answer object (read_annotations shares equal flat answers, so a radio scheme
    has a handful). `ambiguous`: keys reached from maps written in different orders (a multilabel's), whose
    representative answer Potato's order of the votes decides."""

    def __init__(self) -> None:
        self._by_object: dict[int, tuple[Any, str, Any]] = {}
        self._first: dict[str, str] = {}
        self.ambiguous: set[str] = set()

    def __call__(self, value_map: Any) -> tuple[str, Any]:
        known = self._by_object.get(id(value_map))
        if known is not None:
            return known[1], known[2]
        answer = value_map if isinstance(value_map, dict) else {"_value": value_map}
        key = json.dumps(answer, sort_keys=True, ensure_ascii=False)
        self._by_object[id(value_map)] = (value_map, key, answer)  # the object kept, so its id stays its own
        written = json.dumps(answer, ensure_ascii=False)
        if self._first.setdefault(key, written) != written:
            self.ambiguous.add(key)
        return key, answer


def _votes(
    found: Annotations, schema: str, wanted: Collection[str], canonical: _Canonical
) -> list[tuple[str, list[tuple[str, str, Any]]]]:
    """Per user in first-seen order, the (item, key, answer) of each vote on `schema` for an item of `wanted`."""
    return [
        (user, [(iid, *canonical(value_map)) for iid, value_map in answers.items() if iid in wanted])
        for user, answers in found.of(schema)
    ]


def _majority(found: Annotations, wanted: Collection[str], schemas: Collection[str]) -> dict[str, Answers]:
    """Per item and scheme, the most frequent exact answer; a tie goes to the first annotator's."""
    references: dict[str, Answers] = {}
    for schema in schemas:
        by_item: dict[str, list[tuple[str, Any]]] = {}
        for _, votes in _votes(found, schema, wanted, _Canonical()):
            for iid, key, answer in votes:
                by_item.setdefault(iid, []).append((key, answer))
        for iid, pairs in by_item.items():
            winner = Counter(key for key, _ in pairs).most_common(1)[0][0]
            references.setdefault(iid, {})[schema] = next(answer for key, answer in pairs if key == winner)
    return references


def _consensus(found: Annotations, ids: Sequence[str], schemas: Collection[str]) -> dict[str, Answers]:
    """Dawid-Skene per scheme (the others' answers change nothing there), each distinct exact answer a class."""
    position = {iid: n for n, iid in enumerate(ids)}
    references: dict[str, Answers] = {}
    for schema in schemas:
        blocks = [(n, answers) for n, (_, answers) in enumerate(found.of(schema)) if answers]
        values = [value for _, answers in blocks for value in answers.values()]
        pos = np.fromiter(
            chain.from_iterable(map(position.get, answers, repeat(-1)) for _, answers in blocks),
            dtype=np.int64,
            count=len(values),
        )
        keep = pos >= 0  # votes on items of the data files only
        if not keep.any():
            continue
        worker = np.concatenate([np.full(len(answers), n, dtype=np.int64) for n, answers in blocks])[keep]
        # Each distinct answer object keyed once (read_annotations shares equal ones), not each vote.
        kept = np.flatnonzero(keep)
        _, first, of_vote = np.unique(
            np.fromiter(map(id, values), dtype=np.uint64, count=len(values))[kept],
            return_index=True,
            return_inverse=True,
        )
        of_vote = of_vote.reshape(-1)
        canonical = _Canonical()
        keyed = [canonical(values[at]) for at in kept[first].tolist()]
        classes = sorted({key for key, _ in keyed})
        class_of = {key: n for n, key in enumerate(classes)}
        said = np.array([class_of[key] for key, _ in keyed], dtype=np.int64)[of_vote]
        answer_of = _representatives(keyed, canonical, class_of, pos[keep], worker, said, of_vote)
        for iid, key in dawid_skene_arrays(ids, pos[keep], worker, said, classes).items():
            references.setdefault(iid, {})[schema] = answer_of[key]
    return references


def _representatives(
    keyed: list[tuple[str, Any]],
    canonical: _Canonical,
    class_of: dict[str, int],
    pos: Any,
    worker: Any,
    said: Any,
    of_vote: Any,
) -> dict[str, Any]:
    """The answer that stands for each class: any of its answers, all written alike; where a class's answers
    are written in different orders (a multilabel's), the last vote's in Potato's order (users as first seen,
    then items sorted): it orders the list."""
    answer_of = dict(keyed)
    for key in canonical.ambiguous:
        at = np.flatnonzero(said == class_of[key])
        last = at[np.lexsort((pos[at], worker[at]))[-1]]
        answer_of[key] = keyed[int(of_vote[last])][1]
    return answer_of


_SWAPPED = {"A": "B", "B": "A"}


def _picked(value_map: Any, name: str, swapped: bool, kind: str) -> Any:
    """The answer stored under `name` as the label map Potato's readers expect (a label: {label: label}; a set:
    each label; a number: {name: number}), read from the pair as the data file orders it (None: no answer)."""
    value = value_map.get(name) if isinstance(value_map, dict) else None
    if value is None or value == "":
        return None
    if kind == "multilabel":  # comma-joined (a hierarchical multiselect's)
        return {label: label for label in str(value).split(",") if label} or None
    if kind == "nominal":
        label = _SWAPPED.get(str(value), str(value)) if swapped else str(value)
        return {label: label}
    try:
        number = float(value)
    except (TypeError, ValueError):
        return {str(value): str(value)}  # a point of a labelled scale (a multirate row's rating)
    return {name: -number if swapped else value}  # shown B first: "A much better" meant the file's second text


def pick_answers(found: Annotations, fields: dict[str, tuple[str, str, bool]], kinds: dict[str, str]) -> None:
    """Each scheme in `fields` ({schema: (the scheme its answers are stored under, the name its answer is
    stored under, whether it compares a pair)}) gets, per answer there, that name's value as a label map
    (`kinds`: each scheme's kind), in the data file's order where Potato showed a pair swapped (its recorded
    presentation order: only a pair's order moves what an answer means); an answer without it is no vote.
    Equal answers stay one object, as read_annotations left them."""
    for user, by_scheme in found.by_user.items():
        for schema, (source, name, paired) in fields.items():
            stored = by_scheme.get(source)
            orders = found.orders.get(user, {}).get(source, {}) if paired else {}
            if not stored:
                continue
            shared: dict[tuple[int, bool], tuple[Any, Any]] = {}  # the answer kept with its pick: its id stays
            picked_answers: dict[str, Any] = {}
            for iid, answer in stored.items():
                swapped = orders.get(iid, [0])[:1] == [1]
                key = (id(answer), swapped)
                if key not in shared:
                    shared[key] = (answer, _picked(answer, name, swapped, kinds[schema]))
                if shared[key][1] is not None:
                    picked_answers[iid] = shared[key][1]
            by_scheme[schema] = picked_answers


def resolve_references(
    found: Annotations, ids: Sequence[str], aggregation: str, schemas: Collection[str]
) -> dict[str, Answers]:
    """One agreed answer per item of `ids` (sorted) and scheme of `schemas` (the run's: Potato resolves every
    scheme, and each scheme's answer is the same either way): consensus needs two annotators, else (or on
    failure) majority."""
    if aggregation == "consensus" and len(found.users) > 1:
        try:
            return _consensus(found, ids, schemas)
        except (ArithmeticError, ValueError, TypeError):
            pass  # Potato falls back to majority the same way
    return _majority(found, set(ids), schemas)


def answered_items(found: Annotations, ids: Collection[str]) -> set[str]:
    """The items of `ids` someone answered, in any scheme: Potato's n_annotated, counted over every scheme."""
    return {iid for iid in found.answered if iid in ids}


def _chosen(value_map: Any) -> list[str]:
    if isinstance(value_map, dict):
        return [str(name) for name, value in value_map.items() if value not in _UNSET]
    return [value_map] if isinstance(value_map, str) else []


def _label_of(value_map: Any) -> str | None:
    """The one selected label; None for none or several."""
    if not isinstance(value_map, (str, dict)):
        return None if value_map is None else str(value_map)
    chosen = _chosen(value_map)
    return chosen[0] if len(chosen) == 1 else None


def _target(kind: str, value_map: Any) -> Any:
    """The training target of one agreed answer, by schema kind."""
    if kind == "multilabel":
        return _chosen(value_map)
    if kind in ("span", "geometry", "grounding"):
        return value_map.get("_spans" if kind == "span" else "_objects", []) if isinstance(value_map, dict) else []
    if kind in ("ordinal", "continuous"):
        single = isinstance(value_map, dict) and len(value_map) == 1
        try:
            return float(next(iter(value_map.values())) if single else value_map)
        except (TypeError, ValueError):
            return _label_of(value_map)  # an older file's {"4": "true"} gives the label "4", not 4.0
    return _label_of(value_map)


def all_targets(
    references: dict[str, Answers], kinds: dict[str, str]
) -> tuple[dict[str, Answers], dict[str, list[str]]]:
    """{item: targets} of the items with a usable answer, and the sorted labels seen per scheme."""
    targets: dict[str, Answers] = {}
    seen: dict[str, set[str]] = {name: set() for name in kinds}
    # Agreed answers are shared objects (read_annotations shares equal ones): each one's target worked out once.
    known: dict[tuple[str, int], tuple[Any, Any]] = {}
    for iid, resolved in references.items():
        for name, kind in kinds.items():
            if name not in resolved:
                continue
            answer = resolved[name]
            memo = known.get((name, id(answer)))
            if memo is None:
                memo = known[(name, id(answer))] = (answer, _target(kind, answer))  # the answer kept: its id stays
                if kind in ("multilabel", "nominal") and memo[1] not in (None, [], ""):  # only these have a vocabulary
                    seen[name].update(map(str, memo[1]) if kind == "multilabel" else [str(memo[1])])
            target = memo[1]
            if target is None or target == [] or target == "":
                continue
            targets.setdefault(iid, {})[name] = list(target) if type(target) is list else target
    return targets, {name: sorted(labels) for name, labels in seen.items()}


def no_labels_error(config: ProjectConfig, n_items: int, found: Annotations, names: Sequence[str]) -> PotatoQueueError:
    return PotatoQueueError(
        f"no labelled items to train on: {n_items} items and {found.n_records} annotation records under "
        f"{config.output_path}, none with a usable answer for {', '.join(names)}",
        fix="label some items in Potato first (answers are read from <output_annotation_dir>/<user>/user_state.json), "
        "and check that data_files, item_properties.id_key and the scheme names match what was annotated",
    )
