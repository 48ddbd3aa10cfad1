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
from collections.abc import Sequence
from typing import Any

from potato_queue.bundle.read import Annotations, Answers
from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError

# What the other stages of the bundle use; the rest is this stage's own.
__all__ = ["all_targets", "no_labels_error", "resolve_references"]

_UNSET = (None, "", False, 0, "false")  # Potato's "not selected"; the string "0" is a selection


def _canonical(value_map: Any) -> tuple[str, Any]:
    """The exact-match key of one answer, and the answer as a map."""
    value_map = value_map if isinstance(value_map, dict) else {"_value": value_map}
    return json.dumps(value_map, sort_keys=True, ensure_ascii=False), value_map


def _majority(found: Annotations, ids: Sequence[str]) -> dict[str, Answers]:
    """Per item and scheme, the most frequent exact answer; a tie goes to the first annotator's."""
    references: dict[str, Answers] = {}
    for iid in ids:
        votes: dict[str, list[tuple[str, Any]]] = {}
        for user in found.users:
            for schema, value_map in found.index.get((user, iid), {}).items():
                votes.setdefault(schema, []).append(_canonical(value_map))
        for schema, pairs in votes.items():
            winner = Counter(key for key, _ in pairs).most_common(1)[0][0]
            references.setdefault(iid, {})[schema] = next(value for key, value in pairs if key == winner)
    return references


def _ds_confusions(posteriors: dict[str, list[float]], observed: dict[str, list[tuple[str, int]]],
                   workers: list[str], k: int) -> dict[str, list[list[float]]]:
    """M-step: each worker's P(says l | truly j); uniform for a class they never met."""
    num = {w: [[0.0] * k for _ in range(k)] for w in workers}
    den = {w: [0.0] * k for w in workers}
    for item, seen in observed.items():
        for worker, said in seen:
            for j in range(k):
                num[worker][j][said] += posteriors[item][j]
                den[worker][j] += posteriors[item][j]
    return {w: [[num[w][j][s] / den[w][j] for s in range(k)] if den[w][j] > 0 else [1.0 / k] * k for j in range(k)]
            for w in workers}


def _dawid_skene(observations: list[tuple[str, str, str]], max_iter: int = 100, tol: float = 1e-6) -> dict[str, str]:
    """{item: label} by Potato's Dawid-Skene EM, the same float operations in the same order."""
    workers = sorted({w for w, _, _ in observations})
    classes = sorted({label for _, _, label in observations})
    k = len(classes)
    observed: dict[str, list[tuple[str, int]]] = {item: [] for item in sorted({i for _, i, _ in observations})}
    for worker, item, label in observations:
        observed[item].append((worker, classes.index(label)))
    if k == 1:
        return dict.fromkeys(observed, classes[0])
    posteriors = {item: [float(sum(1 for _, s in seen if s == j)) for j in range(k)] for item, seen in observed.items()}
    posteriors = {item: [c / sum(counts) for c in counts] for item, counts in posteriors.items()}
    previous = None
    for _ in range(max_iter):
        prior = [0.0] * k
        for item in observed:
            for j in range(k):
                prior[j] += posteriors[item][j]
        prior = [p / (sum(prior) or 1.0) for p in prior]
        confusion = _ds_confusions(posteriors, observed, workers, k)
        likelihood = 0.0
        for item, seen in observed.items():
            scores = list(prior)
            for worker, said in seen:
                for j in range(k):
                    scores[j] *= confusion[worker][j][said]
            mass = sum(scores)
            posteriors[item] = [x / mass for x in scores] if mass > 0 else [1.0 / k] * k
            likelihood += math.log(mass) if mass > 0 else 0.0
        if previous is not None and abs(likelihood - previous) < tol:
            break
        previous = likelihood
    # max() keeps the first of equal posteriors: a tie goes to the first class in sorted order.
    return {item: classes[max(range(k), key=lambda j: p[j])] for item, p in posteriors.items()}


def _consensus(found: Annotations, ids: Sequence[str]) -> dict[str, Answers]:
    """Dawid-Skene per scheme, each distinct exact answer a class."""
    observations: dict[str, list[tuple[str, str, str]]] = {}
    answer_of: dict[str, dict[str, Any]] = {}
    for user in found.users:
        for iid in ids:
            for schema, value_map in found.index.get((user, iid), {}).items():
                key, answer = _canonical(value_map)
                observations.setdefault(schema, []).append((user, iid, key))
                # The last annotator's map stands for its class: it orders a multilabel list.
                answer_of.setdefault(schema, {})[key] = answer
    references: dict[str, Answers] = {}
    for schema, seen in observations.items():
        for iid, key in _dawid_skene(seen).items():
            references.setdefault(iid, {})[schema] = answer_of[schema][key]
    return references


def resolve_references(found: Annotations, ids: Sequence[str], aggregation: str) -> dict[str, Answers]:
    """One agreed answer per item: consensus needs two annotators, else (or on failure) majority."""
    if aggregation == "consensus" and len(found.users) > 1:
        try:
            return _consensus(found, ids)
        except (ArithmeticError, ValueError, TypeError):
            pass  # Potato falls back to majority the same way
    return _majority(found, ids)


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
