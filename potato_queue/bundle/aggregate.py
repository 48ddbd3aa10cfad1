"""Stage 2 of a bundle build: merging several annotators' answers into one reference.

Per item and scheme one agreed answer, by Potato's Dawid-Skene EM
(aggregation "consensus", with two annotators or more) or else exact-match
majority, the same float operations and tie-breaks as Potato's; then the
training target of each agreed answer by schema kind, and the labels seen.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from potato_queue.bundle.read import Annotations, Answers
from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError

# What the other stages of the bundle use; the rest is this stage's own.
__all__ = ["all_targets", "answered_items", "dawid_skene", "no_labels_error", "resolve_references"]

_UNSET = (None, "", False, 0, "false")  # Potato's "not selected"; the string "0" is a selection


class _Canonical:
    """The exact-match key of one answer (Potato's sorted JSON of it, which orders the classes), and the answer
    as a map; the key worked out once per distinct flat answer, since a scheme has few (a radio's labels)."""

    def __init__(self) -> None:
        self._keys: dict[tuple[Any, ...], str] = {}

    def __call__(self, value_map: Any) -> tuple[str, Any]:
        value_map = value_map if isinstance(value_map, dict) else {"_value": value_map}
        try:
            flat = tuple(value_map.items())
            key = self._keys.get(flat)
        except TypeError:  # a list or a map inside (spans, shapes): not hashable, not cached
            return json.dumps(value_map, sort_keys=True, ensure_ascii=False), value_map
        if key is None:
            key = self._keys[flat] = json.dumps(value_map, sort_keys=True, ensure_ascii=False)
        return key, value_map


def _majority(found: Annotations, ids: Sequence[str], schemas: Collection[str]) -> dict[str, Answers]:
    """Per item and scheme, the most frequent exact answer; a tie goes to the first annotator's."""
    references: dict[str, Answers] = {}
    canonical = _Canonical()
    for iid in ids:
        votes: dict[str, list[tuple[str, Any]]] = {}
        for user in found.users:
            for schema, value_map in found.index.get((user, iid), {}).items():
                if schema in schemas:
                    votes.setdefault(schema, []).append(canonical(value_map))
        for schema, pairs in votes.items():
            winner = Counter(key for key, _ in pairs).most_common(1)[0][0]
            references.setdefault(iid, {})[schema] = next(value for key, value in pairs if key == winner)
    return references


def _ds_arrays(observations: list[tuple[str, str, str]]) -> tuple[list[str], list[str], Any, Any, Any, Any]:
    """The items and classes in sorted order, and the observations as arrays in Potato's order (by item,
    then as given): item, worker and class indexes, and each one's rank among its item's."""
    workers = {w: n for n, w in enumerate(sorted({w for w, _, _ in observations}))}
    classes = sorted({label for _, _, label in observations})
    items = sorted({i for _, i, _ in observations})
    item_of, class_of = {i: n for n, i in enumerate(items)}, {c: n for n, c in enumerate(classes)}
    item = np.fromiter((item_of[i] for _, i, _ in observations), dtype=np.int64, count=len(observations))
    order = np.argsort(item, kind="stable")
    item = item[order]
    worker = np.fromiter((workers[w] for w, _, _ in observations), dtype=np.int64, count=len(observations))[order]
    said = np.fromiter((class_of[c] for _, _, c in observations), dtype=np.int64, count=len(observations))[order]
    rank = np.arange(len(item)) - np.searchsorted(item, item, side="left")
    return items, classes, item, worker, said, rank


def _sequential_sum(columns: Any) -> Any:
    """Row sums added left to right, as Python's loop adds them (numpy's sum may pair them otherwise)."""
    total = columns[:, 0].copy()
    for j in range(1, columns.shape[1]):
        total += columns[:, j]
    return total


def dawid_skene(observations: list[tuple[str, str, str]], max_iter: int = 100, tol: float = 1e-6) -> dict[str, str]:
    """{item: label} by Potato's Dawid-Skene EM (potato.server_utils.consensus.dawid_skene), vectorised: the
    same float operations in the same order (bincount and cumsum add in input order; each item's votes are
    multiplied in in turn), so the same labels to the last item, at numpy's speed."""
    items, classes, item, worker, said, rank = _ds_arrays(observations)
    k, n_workers = len(classes), int(worker.max()) + 1
    if k == 1:
        return dict.fromkeys(items, classes[0])
    posteriors = np.zeros((len(items), k))
    np.add.at(posteriors, (item, said), 1.0)
    posteriors /= _sequential_sum(posteriors)[:, None]
    previous = None
    for _ in range(max_iter):
        prior = np.cumsum(posteriors, axis=0)[-1]
        prior = prior / (float(np.cumsum(prior)[-1]) or 1.0)
        # M-step: each worker's P(says l | truly j); uniform for a class they never met.
        num = np.stack([np.bincount(worker * k + said, weights=posteriors[item, j], minlength=n_workers * k)
                        .reshape(n_workers, k) for j in range(k)], axis=1)
        den = np.stack([np.bincount(worker, weights=posteriors[item, j], minlength=n_workers) for j in range(k)], axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            confusion = np.where(den[:, :, None] > 0, num / den[:, :, None], 1.0 / k)
        # E-step
        scores = np.tile(prior, (len(items), 1))
        for r in range(int(rank.max()) + 1):
            at = rank == r
            scores[item[at]] *= confusion[worker[at], :, said[at]]
        mass = _sequential_sum(scores)
        alive = mass > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            posteriors = np.where(alive[:, None], scores / mass[:, None], 1.0 / k)
        logs = np.fromiter(map(math.log, mass[alive].tolist()), dtype=np.float64, count=int(alive.sum()))
        likelihood = float(np.cumsum(logs)[-1]) if len(logs) else 0.0
        if previous is not None and abs(likelihood - previous) < tol:
            break
        previous = likelihood
    # argmax keeps the first of equal posteriors: a tie goes to the first class in sorted order.
    best = np.argmax(posteriors, axis=1).tolist()
    return {iid: classes[b] for iid, b in zip(items, best, strict=True)}


def _by_user_then_item(found: Annotations, ids: Sequence[str]) -> list[tuple[str, str]]:
    """The (user, item) pairs answered, in Potato's order (users as first seen, items as in `ids`, sorted):
    each user's own answers sorted, not every user against every item."""
    wanted = set(ids)
    mine: dict[str, list[str]] = {user: [] for user in found.users}
    for user, iid in found.index:
        if iid in wanted and user in mine:
            mine[user].append(iid)
    return [(user, iid) for user in found.users for iid in sorted(mine[user])]


def _consensus(found: Annotations, ids: Sequence[str], schemas: Collection[str]) -> dict[str, Answers]:
    """Dawid-Skene per scheme, each distinct exact answer a class."""
    observations: dict[str, list[tuple[str, str, str]]] = {}
    answer_of: dict[str, dict[str, Any]] = {}
    canonical = _Canonical()
    for user, iid in _by_user_then_item(found, ids):
        for schema, value_map in found.index[(user, iid)].items():
            if schema not in schemas:
                continue  # Dawid-Skene is per scheme: the others' answers change nothing here
            key, answer = canonical(value_map)
            observations.setdefault(schema, []).append((user, iid, key))
            # The last annotator's map stands for its class: it orders a multilabel list.
            answer_of.setdefault(schema, {})[key] = answer
    references: dict[str, Answers] = {}
    for schema, seen in observations.items():
        for iid, key in dawid_skene(seen).items():
            references.setdefault(iid, {})[schema] = answer_of[schema][key]
    return references


def resolve_references(found: Annotations, ids: Sequence[str], aggregation: str,
                       schemas: Collection[str]) -> dict[str, Answers]:
    """One agreed answer per item and scheme of `schemas` (the run's: Potato resolves every scheme, and each
    scheme's answer is the same either way): consensus needs two annotators, else (or on failure) majority."""
    if aggregation == "consensus" and len(found.users) > 1:
        try:
            return _consensus(found, ids, schemas)
        except (ArithmeticError, ValueError, TypeError):
            pass  # Potato falls back to majority the same way
    return _majority(found, ids, schemas)


def answered_items(found: Annotations, ids: Collection[str]) -> set[str]:
    """The items of `ids` someone answered, in any scheme: Potato's n_annotated, counted over every scheme."""
    return {iid for _, iid in found.index if iid in ids}


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


def all_targets(references: dict[str, Answers], kinds: dict[str, str]
                 ) -> tuple[dict[str, Answers], dict[str, list[str]]]:
    """{item: targets} of the items with a usable answer, and the sorted labels seen per scheme."""
    targets: dict[str, Answers] = {}
    seen: dict[str, set[str]] = {name: set() for name in kinds}
    for iid, resolved in references.items():
        for name, kind in kinds.items():
            target = _target(kind, resolved[name]) if name in resolved else None
            if target is None or target == [] or target == "":
                continue
            targets.setdefault(iid, {})[name] = target
            if kind in ("multilabel", "nominal"):  # only these have a vocabulary
                seen[name].update(map(str, target) if kind == "multilabel" else [str(target)])
    return targets, {name: sorted(labels) for name, labels in seen.items()}


def no_labels_error(config: ProjectConfig, n_items: int, found: Annotations, names: Sequence[str]) -> PotatoQueueError:
    return PotatoQueueError(
        f"no labelled items to train on: {n_items} items and {found.n_records} annotation records under "
        f"{config.output_path}, none with a usable answer for {', '.join(names)}",
        fix="label some items in Potato first (answers are read from <output_annotation_dir>/<user>/user_state.json), "
        "and check that data_files, item_properties.id_key and the scheme names match what was annotated")
