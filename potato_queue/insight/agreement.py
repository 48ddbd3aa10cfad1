"""The model as one more rater: its agreement with the annotators beside theirs with each other.

Per scheme, on the run's held-out items that at least two annotators answered (and the model predicted):
Cohen's kappa (the mean over pairs, each pair on the items it shares), Krippendorff's alpha (nominal) and
percent agreement, each with a bootstrap interval over the items, for the human-human pairs and for the
model-human pairs. Human-human figures are Potato's own definitions (its /admin/iaa: potato/server_utils/iaa
nominal.mean_cohen_kappa_over_shared_items, mean_pairwise_agreement and alpha.krippendorff_alpha; tested
equal). Then one sentence: whether the model sits inside the annotators' own disagreement or outside it.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

from potato_queue.config import ProjectConfig
from potato_queue.insight.compare import annotator_labels
from potato_queue.insight.run_data import shown
from potato_queue.runs.gate import held_out_ids, label_of, schema_kinds

__all__ = [
    "Items",
    "MODEL",
    "BOOTSTRAP_SAMPLES",
    "mean_kappa",
    "pairwise_agreement",
    "alpha_nominal",
    "interval",
    "resamples",
    "schema_agreement",
    "verdict",
    "AGREEMENT_KINDS",
    "run_agreement",
]

Items = Sequence[Mapping[str, Any]]  # one {rater: label} per item
MODEL = "\0model"  # the model's rater key: no annotator's name (a folder name) holds a NUL
BOOTSTRAP_SAMPLES = 200  # the intervals are read to a few hundredths: 200 resamples do; each costs at run end
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


def _weights(items: Items, weights: Sequence[int] | None) -> Sequence[int]:
    return weights if weights is not None else [1] * len(items)


def _kappa_of(cells: Counter[tuple[Any, Any]]) -> float | None:
    """Cohen's kappa from a pair's (label a, label b) counts; None where chance agreement is 1 or no item."""
    n = sum(cells.values())
    if not n:
        return None
    counts_a: Counter[Any] = Counter()
    counts_b: Counter[Any] = Counter()
    for (x, y), count in cells.items():
        counts_a[x] += count
        counts_b[y] += count
    observed = sum(count for (x, y), count in cells.items() if x == y) / n
    chance = sum(counts_a[c] * counts_b[c] for c in counts_a.keys() | counts_b.keys()) / (n * n)
    return None if abs(chance - 1.0) < 1e-12 else (observed - chance) / (1 - chance)


def mean_kappa(
    items: Items, pairs: Sequence[tuple[str, str]] | None = None, weights: Sequence[int] | None = None
) -> float | None:
    """The mean Cohen's kappa over rater pairs (every pair, or `pairs`), each on the items it shares; pairs with
    no shared item or an undefined kappa are left out (Potato's mean_cohen_kappa_over_shared_items). `weights`:
    how many times each item counts (a bootstrap resample of distinct items)."""
    raters = sorted({r for labels in items for r in labels})
    kappas = []
    for a, b in pairs if pairs is not None else combinations(raters, 2):
        cells: Counter[tuple[Any, Any]] = Counter()
        for labels, weight in zip(items, _weights(items, weights), strict=True):
            if weight and a in labels and b in labels:
                cells[(labels[a], labels[b])] += weight
        value = _kappa_of(cells)
        if value is not None:
            kappas.append(value)
    return sum(kappas) / len(kappas) if kappas else None


def pairwise_agreement(
    items: Items, pairs: Sequence[tuple[str, str]] | None = None, weights: Sequence[int] | None = None
) -> float | None:
    """The mean over items of the share of their rater pairs (every pair, or those of `pairs`) that agree
    (Potato's mean_pairwise_agreement, Fleiss' P-bar)."""
    wanted = set(pairs) if pairs is not None else None
    total = n = 0.0
    for labels, weight in zip(items, _weights(items, weights), strict=True):
        its = [
            (a, b) for a, b in combinations(sorted(labels), 2) if wanted is None or (a, b) in wanted or (b, a) in wanted
        ]
        if its and weight:
            total += weight * sum(1 for a, b in its if labels[a] == labels[b]) / len(its)
            n += weight
    return total / n if n else None


def alpha_nominal(items: Items, weights: Sequence[int] | None = None) -> float | None:
    """Krippendorff's alpha for nominal labels over the items with two or more raters (None: one value only)."""
    coincidences: Counter[tuple[Any, Any]] = Counter()
    for labels, weight in zip(items, _weights(items, weights), strict=True):
        values = list(labels.values())
        m = len(values)
        if m < 2 or not weight:
            continue
        for i, j in ((i, j) for i in range(m) for j in range(m) if i != j):
            coincidences[(values[i], values[j])] += weight / (m - 1)
    n_c: Counter[Any] = Counter()
    for (c, _), count in coincidences.items():
        n_c[c] += count
    n = sum(n_c.values())
    if n <= 1:
        return None
    observed = sum(w for (c, k), w in coincidences.items() if c != k)
    expected = sum(n_c[c] * n_c[k] for c in n_c for k in n_c if c != k) / (n - 1)
    return None if expected == 0 else 1 - observed / expected


Figure = Callable[[Items, Sequence[int]], "float | None"]


def resamples(items: Items) -> tuple[list[Mapping[str, Any]], list[list[int]]]:
    """BOOTSTRAP_SAMPLES resamples of the items (a fixed seed: the same run gives the same intervals), as
    counts over their distinct label profiles: a figure then costs what the profiles cost, not the items."""
    index: dict[tuple[tuple[str, Any], ...], int] = {}
    profiles: list[Mapping[str, Any]] = []
    drawn_from: list[int] = []
    for labels in items:
        key = tuple(sorted(labels.items(), key=lambda kv: kv[0]))
        if key not in index:
            index[key] = len(profiles)
            profiles.append(labels)
        drawn_from.append(index[key])
    rng = random.Random(BOOTSTRAP_SEED)
    samples = []
    for _ in range(BOOTSTRAP_SAMPLES):
        counts = Counter(rng.choices(drawn_from, k=len(drawn_from)))
        samples.append([counts.get(p, 0) for p in range(len(profiles))])
    return profiles, samples


def interval(profiles: Items, samples: list[list[int]], figure: Figure) -> list[float] | None:
    """The central 95% of `figure` over the resamples (None when it is undefined in half of them)."""
    values = sorted(v for v in (figure(profiles, weights) for weights in samples) if v is not None)
    if len(values) < len(samples) // 2 or not values:
        return None
    tail = (1 - CONFIDENCE) / 2
    return [round(values[int(tail * (len(values) - 1))], 4), round(values[int((1 - tail) * (len(values) - 1))], 4)]


def _figures(items: Items, pairs: Sequence[tuple[str, str]] | None, alpha: Figure) -> dict[str, Any]:
    out: dict[str, Any] = {}
    figures: list[tuple[str, Figure]] = [
        ("kappa", lambda xs, ws: mean_kappa(xs, pairs, ws)),
        ("alpha", alpha),
        ("percent_agreement", lambda xs, ws: pairwise_agreement(xs, pairs, ws)),
    ]
    profiles, samples = resamples(items)
    for name, figure in figures:
        value = figure(items, [1] * len(items))
        out[name] = None if value is None else round(value, 4)
        out[f"{name}_interval"] = interval(profiles, samples, figure)
    return out


def _model_alpha(items: Items, weights: Sequence[int]) -> float | None:
    """Alpha of the model against each annotator, the mean over annotators (each pair's own reliability data)."""
    humans = sorted({r for labels in items for r in labels} - {MODEL})
    values = []
    for h in humans:
        kept = [(x, w) for x, w in zip(items, weights, strict=True) if h in x and MODEL in x]
        values.append(alpha_nominal([{MODEL: x[MODEL], h: x[h]} for x, _ in kept], [w for _, w in kept]))
    found = [v for v in values if v is not None]
    return sum(found) / len(found) if found else None


def schema_agreement(items: Items) -> dict[str, Any]:
    """One scheme's figures: `items` holds each held-out item's annotators' labels and the model's (MODEL)."""
    usable = [x for x in items if MODEL in x and len(x) >= 3]  # the model and two annotators at least
    humans_only = [{r: v for r, v in x.items() if r != MODEL} for x in usable]
    annotators = sorted({r for x in humans_only for r in x})
    with_model = [(MODEL, h) for h in annotators]
    return {
        "items": len(usable),
        "annotators": len(annotators),
        "human_human": _figures(humans_only, None, lambda xs, ws: alpha_nominal(xs, ws)) if usable else None,
        "model_human": _figures(usable, with_model, _model_alpha) if usable else None,
    }


def verdict(figures: Mapping[str, Any]) -> str:
    """Whether the model sits inside the annotators' own disagreement (by kappa), in one sentence."""
    human, model = figures.get("human_human") or {}, figures.get("model_human") or {}
    low_high = human.get("kappa_interval")
    if not figures.get("items") or model.get("kappa") is None or human.get("kappa") is None or not low_high:
        return "too few held-out items that two annotators answered to tell how the model agrees with them"
    said = f"model-human kappa {model['kappa']:.2f} against human-human {human['kappa']:.2f} ({low_high[0]:.2f} to {low_high[1]:.2f})"
    if model["kappa"] < low_high[0]:
        return f"outside the annotators' own disagreement: the model agrees with them less than they agree with each other ({said})"
    if model["kappa"] > low_high[1]:
        return f"the model agrees with the annotators more than they agree with each other ({said})"
    return f"inside the annotators' own disagreement: the model agrees with them about as often as they agree with each other ({said})"


# The kinds whose labels are compared as categories (a likert's points too, as Potato's nominal figures do).
AGREEMENT_KINDS = ("nominal", "multilabel", "ordinal")


def run_agreement(config: ProjectConfig, bundle_dir: Path, predictions: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scheme of a run, on its held-out items: the figures and the verdict; the annotators' labels as the
    project has them now. What the run's record keeps as `agreement`."""
    held_out = held_out_ids(bundle_dir)
    kinds = schema_kinds(bundle_dir)
    model: dict[str, dict[str, str]] = {}
    for p in predictions:
        iid, schema = str(p.get("instance_id")), str(p.get("schema_name"))
        label = shown(label_of(p))
        if iid in held_out and kinds.get(schema) in AGREEMENT_KINDS and label is not None:
            model.setdefault(schema, {})[iid] = label
    humans = annotator_labels(config, held_out)
    out: dict[str, Any] = {}
    for schema, answers in sorted(model.items()):
        items = [{**humans.get(iid, {}).get(schema, {}), MODEL: label} for iid, label in answers.items()]
        figures = schema_agreement(items)
        out[schema] = {**figures, "said": verdict(figures)}
    return out
