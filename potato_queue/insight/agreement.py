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
from potato_queue.runs.gate import bundle_split_ids, label_of, schema_kinds

__all__ = [
    "Items",
    "MODEL",
    "BOOTSTRAP_SAMPLES",
    "mean_kappa",
    "pairwise_agreement",
    "alpha_nominal",
    "interval",
    "schema_agreement",
    "verdict",
    "AGREEMENT_KINDS",
    "run_agreement",
]

Items = Sequence[Mapping[str, Any]]  # one {rater: label} per item
MODEL = "\0model"  # the model's rater key: no annotator's name (a folder name) holds a NUL
BOOTSTRAP_SAMPLES = 400
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


def _kappa(a: Sequence[Any], b: Sequence[Any]) -> float | None:
    """Cohen's kappa of two aligned label lists; None where chance agreement is 1 (one label throughout)."""
    n = len(a)
    observed = sum(1 for x, y in zip(a, b, strict=True) if x == y) / n
    counts_a, counts_b = Counter(a), Counter(b)
    chance = sum(counts_a[c] * counts_b[c] for c in counts_a.keys() | counts_b.keys()) / (n * n)
    return None if abs(chance - 1.0) < 1e-12 else (observed - chance) / (1 - chance)


def mean_kappa(items: Items, pairs: Sequence[tuple[str, str]] | None = None) -> float | None:
    """The mean Cohen's kappa over rater pairs (every pair, or `pairs`), each on the items it shares; pairs with
    no shared item or an undefined kappa are left out (Potato's mean_cohen_kappa_over_shared_items)."""
    raters = sorted({r for labels in items for r in labels})
    kappas = []
    for a, b in pairs if pairs is not None else combinations(raters, 2):
        shared = [labels for labels in items if a in labels and b in labels]
        value = _kappa([x[a] for x in shared], [x[b] for x in shared]) if shared else None
        if value is not None:
            kappas.append(value)
    return sum(kappas) / len(kappas) if kappas else None


def pairwise_agreement(items: Items, pairs: Sequence[tuple[str, str]] | None = None) -> float | None:
    """The mean over items of the share of their rater pairs (every pair, or those of `pairs`) that agree
    (Potato's mean_pairwise_agreement, Fleiss' P-bar)."""
    wanted = set(pairs) if pairs is not None else None
    shares = []
    for labels in items:
        its = [
            (a, b) for a, b in combinations(sorted(labels), 2) if wanted is None or (a, b) in wanted or (b, a) in wanted
        ]
        if its:
            shares.append(sum(1 for a, b in its if labels[a] == labels[b]) / len(its))
    return sum(shares) / len(shares) if shares else None


def alpha_nominal(items: Items) -> float | None:
    """Krippendorff's alpha for nominal labels over the items with two or more raters (None: one value only)."""
    coincidences: Counter[tuple[Any, Any]] = Counter()
    for labels in items:
        values = list(labels.values())
        m = len(values)
        if m < 2:
            continue
        for i, j in ((i, j) for i in range(m) for j in range(m) if i != j):
            coincidences[(values[i], values[j])] += 1 / (m - 1)
    n_c: Counter[Any] = Counter()
    for (c, _), weight in coincidences.items():
        n_c[c] += weight
    n = sum(n_c.values())
    if n <= 1:
        return None
    observed = sum(w for (c, k), w in coincidences.items() if c != k)
    expected = sum(n_c[c] * n_c[k] for c in n_c for k in n_c if c != k) / (n - 1)
    return None if expected == 0 else 1 - observed / expected


def interval(items: Items, figure: Callable[[Items], float | None]) -> list[float] | None:
    """The central 95% of `figure` over bootstrap resamples of the items (a fixed seed: the same run gives the
    same interval)."""
    rng = random.Random(BOOTSTRAP_SEED)
    values = []
    for _ in range(BOOTSTRAP_SAMPLES):
        value = figure([items[rng.randrange(len(items))] for _ in items])
        if value is not None:
            values.append(value)
    if len(values) < BOOTSTRAP_SAMPLES // 2:
        return None
    values.sort()
    tail = (1 - CONFIDENCE) / 2
    return [round(values[int(tail * (len(values) - 1))], 4), round(values[int((1 - tail) * (len(values) - 1))], 4)]


def _figures(
    items: Items, pairs: Sequence[tuple[str, str]] | None, alpha: Callable[[Items], float | None]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, figure in (
        ("kappa", lambda xs: mean_kappa(xs, pairs)),
        ("alpha", alpha),
        ("percent_agreement", lambda xs: pairwise_agreement(xs, pairs)),
    ):
        value = figure(items)
        out[name] = None if value is None else round(value, 4)
        out[f"{name}_interval"] = interval(items, figure)
    return out


def _model_alpha(items: Items) -> float | None:
    """Alpha of the model against each annotator, the mean over annotators (each pair's own reliability data)."""
    humans = sorted({r for labels in items for r in labels} - {MODEL})
    values = [alpha_nominal([{MODEL: x[MODEL], h: x[h]} for x in items if h in x and MODEL in x]) for h in humans]
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def schema_agreement(items: Items) -> dict[str, Any]:
    """One scheme's figures: `items` holds each held-out item's annotators' labels and the model's (MODEL)."""
    usable = [x for x in items if MODEL in x and len(x) >= 3]  # the model and two annotators at least
    humans_only = [{r: v for r, v in x.items() if r != MODEL} for x in usable]
    annotators = sorted({r for x in humans_only for r in x})
    with_model = [(MODEL, h) for h in annotators]
    return {
        "items": len(usable),
        "annotators": len(annotators),
        "human_human": _figures(humans_only, None, alpha_nominal) if usable else None,
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
HELD_OUT_SPLITS = ("val", "test")


def run_agreement(config: ProjectConfig, bundle_dir: Path, predictions: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scheme of a run, on its held-out items: the figures and the verdict; the annotators' labels as the
    project has them now. What the run's record keeps as `agreement`."""
    splits = bundle_split_ids(bundle_dir)
    held_out = {iid for split in HELD_OUT_SPLITS for iid in splits.get(split, [])}
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
