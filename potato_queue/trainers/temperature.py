"""Temperature scaling from top-class confidences (standard library only).

Potato's predictions keep only the top label and its probability ``p``. Over
``K`` labels we read that as the distribution ``p`` for the top label and
``(1 - p) / (K - 1)`` for each other one, so its logit margin is
``d = log(p (K - 1) / (1 - p))``. Dividing the logits by a temperature ``T``
gives ``p_T = 1 / (1 + (K - 1) exp(-d / T))``; the label never changes.

``T`` is fitted by minimising the negative log-likelihood of the gold labels
on held-out items. The NLL is convex in ``1 / T``, so a golden-section
search over ``1 / T`` finds the optimum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["scaled_confidence", "nll", "expected_calibration_error", "fit_temperature"]

EPS = 1e-6
MIN_INVERSE_T = 0.02
MAX_INVERSE_T = 50.0


def _margin(p: float, k: int) -> float:
    p = min(max(p, EPS), 1.0 - EPS)
    return math.log(p * (k - 1) / (1.0 - p))


def scaled_confidence(p: float, k: int, temperature: float) -> float:
    """The top-class probability after dividing the logits by *temperature*."""
    k = max(k, 2)
    exponent = -_margin(p, k) / temperature
    if exponent > 700:
        return 0.0
    return 1.0 / (1.0 + (k - 1) * math.exp(exponent))


def nll(samples: Sequence[tuple[float, bool]], k: int, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of the gold labels; samples are ``(p, correct)``."""
    if not samples:
        return 0.0
    k = max(k, 2)
    total = 0.0
    for p, correct in samples:
        q = min(max(scaled_confidence(p, k, temperature), EPS), 1.0 - EPS)
        total += -math.log(q) if correct else -math.log((1.0 - q) / (k - 1))
    return total / len(samples)


def expected_calibration_error(samples: Sequence[tuple[float, bool]], bins: int = 10) -> float:
    """ECE: the confidence-vs-accuracy gap, averaged over equal-width bins."""
    if not samples:
        return 0.0
    buckets: list[list[tuple[float, bool]]] = [[] for _ in range(bins)]
    for p, correct in samples:
        buckets[min(int(p * bins), bins - 1)].append((p, correct))
    gap = 0.0
    for bucket in buckets:
        if bucket:
            confidence = sum(p for p, _ in bucket) / len(bucket)
            hit_rate = sum(1 for _, c in bucket if c) / float(len(bucket))
            gap += len(bucket) * abs(confidence - hit_rate)
    return gap / len(samples)


def fit_temperature(samples: Sequence[tuple[float, bool]], k: int, iterations: int = 80) -> float:
    """The temperature minimising :func:`nll` on *samples* (1.0 when there are none)."""
    if not samples:
        return 1.0
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    low, high = math.log(MIN_INVERSE_T), math.log(MAX_INVERSE_T)

    def cost(log_beta: float) -> float:
        return nll(samples, k, 1.0 / math.exp(log_beta))

    a, b = high - ratio * (high - low), low + ratio * (high - low)
    cost_a, cost_b = cost(a), cost(b)
    for _ in range(iterations):
        if cost_a < cost_b:
            high, b, cost_b = b, a, cost_a
            a = high - ratio * (high - low)
            cost_a = cost(a)
        else:
            low, a, cost_a = a, b, cost_b
            b = low + ratio * (high - low)
            cost_b = cost(b)
    return 1.0 / math.exp((low + high) / 2.0)
