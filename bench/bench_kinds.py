"""Quality on a multi-label and an ordinal scheme: potato-queue's sklearn-text against Potato 2.12.1's own, on the
same split.

    .venv/bin/python bench/bench_kinds.py [--items 900] [--seed 0] [--ordinal-items 3000] [--ordinal-seeds 3]

One bundle in Potato's layout (a multiselect of four topics over generated reviews whose words hint at
their topics, with shared and noise words so that no label is free), trained by each side's own worker
process on the same train split and scored on the same test split with one scorer (wire/scoring.py,
as sets). Potato's trainer joins a set into one class ("music|plot") and predicts one of the
combinations it saw; its answer is split back into a set to be scored, which is the most generous
reading of it (published as it is, Potato pre-checks nothing from "music|plot": docs/potato-prelabels.md).
Prints subset accuracy, macro-F1 and micro-F1 for both, and the macro-F1 ratio (goal: >= 1.0x).

The ordinal scheme is a 5-point likert over generated reviews whose words hint at the rating, a word
sometimes taken from the next point up or down (as people write). Potato's trainer takes each point for
an unrelated class ("4.0"); ours codes the order (trainers/scales.py). Prints exact accuracy, MAE, QWK
and Spearman for both, and the MAE ratio, Potato's over ours (goal: >= 1.0x, ours no further off).
With --fine-tune, hf-text-classification (the packaged all-MiniLM-L6-v2, on this machine's device) trains
the multiselect and the likert too (goal: above Potato's macro-F1, below its MAE).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.quick import quick_args  # noqa: E402
from potato_queue.wire.scoring import MULTILABEL, ORDINAL, score  # noqa: E402
from tests.e2e.trainers.test_worker import write_bundle  # noqa: E402

TOPICS = ["acting", "music", "plot", "visuals"]
HINTS = {
    "acting": ["cast", "performance", "actor", "lead", "role"],
    "music": ["score", "soundtrack", "song", "melody", "composer"],
    "plot": ["story", "twist", "ending", "script", "pacing"],
    "visuals": ["camera", "colour", "shot", "effects", "lighting"],
}
SHARED = ["scene", "moment", "part", "work", "detail"]  # any topic's review may use them
FILLER = ["honestly", "really", "quite", "the", "film", "was", "and", "overall", "felt", "i", "thought"]
SCHEME = {
    "name": "topics",
    "annotation_type": "multiselect",
    "kind": "multilabel",
    "labels": TOPICS,
    "source_field": None,
}


def reviews(n: int, seed: int) -> list[dict[str, Any]]:
    """Reviews with one to three topics; a hint word is sometimes swapped for a shared one (noise)."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        chosen = sorted(rng.sample(TOPICS, rng.choice([1, 1, 2, 2, 3])))
        words = [rng.choice(HINTS[t]) if rng.random() > 0.2 else rng.choice(SHARED) for t in chosen]
        words += rng.sample(FILLER, 4)
        rng.shuffle(words)
        items.append({"id": f"b{i:04d}", "text": " ".join(words), "label": None if i % 10 == 9 else chosen})
    return items


RATING_WORDS = {
    1: ["awful", "dreadful", "painful"],
    2: ["weak", "poor", "dull"],
    3: ["okay", "average", "uneven"],
    4: ["good", "solid", "enjoyable"],
    5: ["superb", "brilliant", "masterful"],
}
FINE_TUNER = "hf-text-classification"  # with its default model, the packaged all-MiniLM-L6-v2
LIKERT = {"name": "stars", "annotation_type": "likert", "kind": "ordinal", "labels": [], "source_field": None}


def rated_reviews(n: int, seed: int) -> list[dict[str, Any]]:
    """Reviews rated 1 to 5; each of their two rating words is from the next point up or down a third of the time."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        stars = rng.randint(1, 5)
        words = [
            rng.choice(RATING_WORDS[min(5, max(1, stars + (rng.choice([-1, 1]) if rng.random() < 0.33 else 0)))])
            for _ in range(2)
        ] + rng.sample(FILLER, 4)
        rng.shuffle(words)
        items.append({"id": f"s{i:04d}", "text": " ".join(words), "label": None if i % 10 == 9 else float(stars)})
    return items


def spec(folder: Path, bundle: Path, schemas: list[Any], trainer: str = "sklearn-text") -> Path:
    path = folder / "spec.json"
    path.write_text(
        json.dumps(
            {
                "v": 1,
                "run_id": "20260101T000000-bench0",
                "trainer": trainer,
                "schemas": schemas,
                "bundle_dir": str(bundle),
                "workdir": str(folder / "work"),
                "params": {},
                "seed": 0,
                "limits": {"max_wall_s": 600, "max_ram_mb": None, "device": "cpu", "num_threads": 1},
            }
        )
    )
    return path


def train(
    module: str, folder: Path, bundle: Path, schemas: list[Any], kind: str = MULTILABEL, trainer: str = "sklearn-text"
) -> tuple[dict[str, Any], float]:
    """Runs `python -m <module> --spec`; each test item's predicted set, and the seconds it took."""
    folder.mkdir()
    started_s = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", module, "--spec", str(spec(folder, bundle, schemas, trainer))],
        capture_output=True,
        text=True,
        cwd=str(folder),
    )
    took_s = time.perf_counter() - started_s
    if done.returncode != 0:
        raise SystemExit(f"{module} failed ({done.returncode}): {done.stderr[-2000:]}")
    predicted = {}
    for line in (folder / "work" / "predictions.jsonl").read_text().splitlines():
        p = json.loads(line)
        payload = p["payload"]
        label = [x["label"] for x in payload] if isinstance(payload, list) else payload.get("label")
        if kind == ORDINAL:
            predicted[p["instance_id"]] = label  # "4.0" (Potato's) and 4 (ours) are both read as numbers
            continue
        predicted[p["instance_id"]] = label.split("|") if isinstance(label, str) else label
    return predicted, took_s


def multilabel(args: argparse.Namespace, tmp: Path) -> None:
    write_bundle(tmp / "bundle", reviews(args.items, args.seed), scheme=SCHEME)
    rows = [json.loads(line) for line in (tmp / "bundle" / "test.jsonl").read_text().splitlines()]
    gold = {row["instance_id"]: row["targets"]["topics"] for row in rows}
    ours, ours_s = train("potato_queue.worker", tmp / "ours", tmp / "bundle", ["topics"])
    potato, potato_s = train("potato.training.worker", tmp / "potato", tmp / "bundle", [SCHEME])
    table = [
        ("potato-queue sklearn-text", score(gold, ours, MULTILABEL), ours_s),
        ("Potato 2.12.1 sklearn-text", score(gold, potato, MULTILABEL), potato_s),
    ]
    if args.fine_tune:
        tuned, tuned_s = train("potato_queue.worker", tmp / "tuned", tmp / "bundle", ["topics"], MULTILABEL, FINE_TUNER)
        table.append((f"potato-queue {FINE_TUNER}", score(gold, tuned, MULTILABEL), tuned_s))
    print(f"Multi-label (multiselect of {len(TOPICS)} topics), {args.items} items, {len(gold)} in test:")
    print(f"{'':38} {'subset acc':>10} {'macro-F1':>9} {'micro-F1':>9} {'time':>7}")
    for name, scores, took_s in table:
        print(
            f"{name:38} {scores['accuracy']:>10.3f} {scores['macro_f1']:>9.3f} {scores['micro_f1']:>9.3f} "
            f"{took_s:>6.1f}s"
        )
    ratio = table[0][1]["macro_f1"] / table[1][1]["macro_f1"] if table[1][1]["macro_f1"] else float("inf")
    print(f"macro-F1 ratio, potato-queue / Potato: {ratio:.2f}x (goal >= 1.0x)", flush=True)
    if args.fine_tune:
        print(
            f"macro-F1 ratio, {FINE_TUNER} / Potato: {table[2][1]['macro_f1'] / table[1][1]['macro_f1']:.2f}x "
            f"(goal > 1.0x)",
            flush=True,
        )


def ordinal(args: argparse.Namespace, tmp: Path) -> None:
    """Both trainers on `--ordinal-seeds` likert projects of `--ordinal-items` items: each seed's scores, then their
    mean (one test split of a hundred items moves MAE by a few hundredths either way)."""
    print(f"\nOrdinal (a 5-point likert), {args.ordinal_items} items, seeds 0-{args.ordinal_seeds - 1}:")
    print(f"{'':46} {'accuracy':>9} {'MAE':>7} {'QWK':>7} {'Spearman':>9} {'time':>7}")
    mae: dict[str, list[float]] = {}
    for seed in range(args.ordinal_seeds):
        bundle = tmp / f"likert-{seed}"
        write_bundle(bundle, rated_reviews(args.ordinal_items, seed), scheme=LIKERT)
        rows = [json.loads(line) for line in (bundle / "test.jsonl").read_text().splitlines()]
        gold = {row["instance_id"]: row["targets"]["stars"] for row in rows}
        sides = [
            ("ours", "potato_queue.worker", ["stars"], "sklearn-text"),
            ("potato", "potato.training.worker", [LIKERT], "sklearn-text"),
        ]
        if args.fine_tune:
            sides.append(("fine-tuned", "potato_queue.worker", ["stars"], FINE_TUNER))
        for side, module, schemas, trainer in sides:
            predicted, took_s = train(module, tmp / f"{side}-likert-{seed}", bundle, schemas, ORDINAL, trainer)
            scores = score(gold, predicted, ORDINAL)
            mae.setdefault(side, []).append(scores["mae"])
            name = f"{'Potato 2.12.1' if side == 'potato' else 'potato-queue'} {trainer}, seed {seed}"
            print(
                f"{name:46} {scores['accuracy']:>9.3f} {scores['mae']:>7.3f} {scores['qwk']:>7.3f} "
                f"{scores['spearman']:>9.3f} {took_s:>6.1f}s  ({len(gold)} in test)"
            )
    ours, potato = (sum(mae[side]) / len(mae[side]) for side in ("ours", "potato"))
    print(
        f"mean MAE: potato-queue {ours:.3f}, Potato {potato:.3f}; ratio Potato / potato-queue: {potato / ours:.2f}x "
        f"(goal >= 1.0x: potato-queue no further off)",
        flush=True,
    )
    if args.fine_tune:
        tuned = sum(mae["fine-tuned"]) / len(mae["fine-tuned"])
        print(
            f"mean MAE, {FINE_TUNER}: {tuned:.3f}; ratio Potato / it: {potato / tuned:.2f}x (goal > 1.0x)", flush=True
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=900)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ordinal-items", type=int, default=3000)
    parser.add_argument("--ordinal-seeds", type=int, default=3)
    parser.add_argument("--fine-tune", action="store_true", help=f"also {FINE_TUNER} (MiniLM; minutes on a CPU)")
    args = quick_args(parser, items=200, ordinal_items=300, ordinal_seeds=1)
    with tempfile.TemporaryDirectory(prefix="bench-kinds-") as folder:
        multilabel(args, Path(folder))
        ordinal(args, Path(folder))


if __name__ == "__main__":
    main()
