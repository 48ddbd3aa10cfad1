"""Potato's Dawid-Skene EM (potato.server_utils.consensus.dawid_skene), vectorised with numpy.

The same float operations in the same order as Potato's loops (bincount and cumsum add in input order; each
item's votes are multiplied in in turn; row sums added left to right), so the same label for every item, at
numpy's speed. The votes come as arrays (aggregate.py builds them from the annotations without a Python pass
per vote) or, for a caller with a list, as (worker, item, label) observations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["dawid_skene", "dawid_skene_arrays"]


def dawid_skene(observations: Sequence[tuple[str, str, str]], max_iter: int = 100, tol: float = 1e-6) -> dict[str, str]:
    """{item: label} from (worker, item, label) observations, in Potato's order (each item's as given)."""
    ids, classes = sorted({o[1] for o in observations}), sorted({o[2] for o in observations})
    position, class_of = {iid: n for n, iid in enumerate(ids)}, {c: n for n, c in enumerate(classes)}
    worker_of: dict[str, int] = {}
    n = len(observations)
    pos = np.fromiter((position[o[1]] for o in observations), dtype=np.int64, count=n)
    worker = np.fromiter((worker_of.setdefault(o[0], len(worker_of)) for o in observations), dtype=np.int64, count=n)
    said = np.fromiter((class_of[o[2]] for o in observations), dtype=np.int64, count=n)
    return dawid_skene_arrays(ids, pos, worker, said, classes, max_iter, tol)


def dawid_skene_arrays(
    ids: Sequence[str], pos: Any, worker: Any, said: Any, classes: Sequence[str], max_iter: int = 100, tol: float = 1e-6
) -> dict[str, str]:
    """{item: label} from votes as arrays in Potato's order (each item's in turn): the item's position in `ids`
    (sorted), the worker (any numbering), the class's position in `classes` (sorted)."""
    voted, item = np.unique(pos, return_inverse=True)
    item = item.reshape(-1)
    order = np.argsort(item, kind="stable")
    item, worker, said = item[order], np.asarray(worker)[order], np.asarray(said)[order]
    rank = np.arange(len(item)) - np.searchsorted(item, item, side="left")
    return _dawid_skene(([ids[n] for n in voted.tolist()], list(classes), item, worker, said, rank), max_iter, tol)


def _sequential_sum(columns: Any) -> Any:
    """Row sums added left to right, as Python's loop adds them (numpy's sum may pair them otherwise)."""
    total = columns[:, 0].copy()
    for j in range(1, columns.shape[1]):
        total += columns[:, j]
    return total


class _Likelihood:
    """One EM step's log-likelihood: the sum of log(mass) added in order. `fast` by numpy's log; `exact` by
    math.log, as Potato takes it (numpy's log may differ in the last bit), worked out only when asked."""

    def __init__(self, mass: Any) -> None:
        self.mass, self.n = mass, len(mass)
        self.fast = float(np.cumsum(np.log(mass))[-1]) if self.n else 0.0
        self._exact: float | None = None

    @property
    def exact(self) -> float:
        if self._exact is None:
            logs = np.fromiter(map(math.log, self.mass.tolist()), dtype=np.float64, count=self.n)
            self._exact = float(np.cumsum(logs)[-1]) if self.n else 0.0
        return self._exact


def _converged(now: _Likelihood, previous: _Likelihood, tol: float) -> bool:
    """Whether Potato's EM stops here: the change of log-likelihood under tol, as math.log gives it. numpy's
    log decides where it cannot tip the answer (each sum is within n ulp of the exact one); near the edge the
    exact sums decide."""
    change = abs(now.fast - previous.fast)
    slack = 4 * (now.n + previous.n + 2) * np.finfo(np.float64).eps * (abs(now.fast) + abs(previous.fast))
    if abs(change - tol) > slack:
        return change < tol
    return abs(now.exact - previous.exact) < tol


def _dawid_skene(arrays: tuple[list[str], list[str], Any, Any, Any, Any], max_iter: int, tol: float) -> dict[str, str]:
    items, classes, item, worker, said, rank = arrays
    k, n_workers = len(classes), int(worker.max()) + 1
    if k == 1:
        return dict.fromkeys(items, classes[0])
    posteriors = np.zeros((len(items), k))
    np.add.at(posteriors, (item, said), 1.0)
    posteriors /= _sequential_sum(posteriors)[:, None]
    cell = worker * k + said
    # Each item's votes are multiplied in in turn: the r-th vote of every item at once, as a row of a small
    # table (one per worker and answer, and a row of ones for an item with fewer votes: x * 1.0 is x).
    by_rank = np.full((int(rank.max()) + 1, len(items)), n_workers * k, dtype=np.int64)
    by_rank[rank, item] = cell
    previous: _Likelihood | None = None
    for _ in range(max_iter):
        prior = np.cumsum(posteriors, axis=0)[-1]
        prior = prior / (float(np.cumsum(prior)[-1]) or 1.0)
        # M-step: each worker's P(says l | truly j); uniform for a class they never met.
        per_vote = np.take(posteriors, item, axis=0)
        num = np.stack(
            [
                np.bincount(cell, weights=per_vote[:, j], minlength=n_workers * k).reshape(n_workers, k)
                for j in range(k)
            ],
            axis=1,
        )
        den = np.stack([np.bincount(worker, weights=per_vote[:, j], minlength=n_workers) for j in range(k)], axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            confusion = np.where(den[:, :, None] > 0, num / den[:, :, None], 1.0 / k)
        # E-step
        factors = np.vstack([confusion.transpose(0, 2, 1).reshape(n_workers * k, k), np.ones((1, k))])
        scores = np.tile(prior, (len(items), 1))
        for cells in by_rank:
            scores *= np.take(factors, cells, axis=0)
        mass = _sequential_sum(scores)
        alive = mass > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            posteriors = np.where(alive[:, None], scores / mass[:, None], 1.0 / k)
        now = _Likelihood(mass[alive])
        if previous is not None and _converged(now, previous, tol):
            break
        previous = now
    # argmax keeps the first of equal posteriors: a tie goes to the first class in sorted order.
    best = np.argmax(posteriors, axis=1).tolist()
    return {iid: classes[b] for iid, b in zip(items, best, strict=True)}
