"""Quality on a multi-label scheme: potato-queue's sklearn-text against Potato 2.12.1's own, on the same split.

    .venv/bin/python bench/bench_kinds.py [--items 900] [--seed 0]

One bundle in Potato's layout (a multiselect of four topics over generated reviews whose words hint at
their topics, with shared and noise words so that no label is free), trained by each side's own worker
process on the same train split and scored on the same test split with one scorer (worker/scoring.py,
as sets). Potato's trainer joins a set into one class ("music|plot") and predicts one of the
combinations it saw; its answer is split back into a set to be scored, which is the most generous
reading of it (published as it is, Potato pre-checks nothing from "music|plot": docs/potato-prelabels.md).
Prints subset accuracy, macro-F1 and micro-F1 for both, and the macro-F1 ratio (goal: >= 1.0x).
Ordinal and continuous schemes join this benchmark with their trainers.
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

from potato_queue.worker.scoring import MULTILABEL, score  # noqa: E402
from tests.test_worker import write_bundle  # noqa: E402

TOPICS = ["acting", "music", "plot", "visuals"]
HINTS = {"acting": ["cast", "performance", "actor", "lead", "role"],
         "music": ["score", "soundtrack", "song", "melody", "composer"],
         "plot": ["story", "twist", "ending", "script", "pacing"],
         "visuals": ["camera", "colour", "shot", "effects", "lighting"]}
SHARED = ["scene", "moment", "part", "work", "detail"]  # any topic's review may use them
FILLER = ["honestly", "really", "quite", "the", "film", "was", "and", "overall", "felt", "i", "thought"]
SCHEME = {"name": "topics", "annotation_type": "multiselect", "kind": "multilabel", "labels": TOPICS,
          "source_field": None}


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


def spec(folder: Path, bundle: Path, schemas: list[Any]) -> Path:
    path = folder / "spec.json"
    path.write_text(json.dumps({"v": 1, "run_id": "20260101T000000-bench0", "trainer": "sklearn-text",
                                "schemas": schemas, "bundle_dir": str(bundle), "workdir": str(folder / "work"),
                                "params": {}, "seed": 0,
                                "limits": {"max_wall_s": 600, "max_ram_mb": None, "device": "cpu", "num_threads": 1}}))
    return path


def train(module: str, folder: Path, bundle: Path, schemas: list[Any]) -> tuple[dict[str, Any], float]:
    """Runs `python -m <module> --spec`; each test item's predicted set, and the seconds it took."""
    folder.mkdir()
    started_s = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", module, "--spec", str(spec(folder, bundle, schemas))],
                          capture_output=True, text=True, cwd=str(folder))
    took_s = time.perf_counter() - started_s
    if done.returncode != 0:
        raise SystemExit(f"{module} failed ({done.returncode}): {done.stderr[-2000:]}")
    predicted = {}
    for line in (folder / "work" / "predictions.jsonl").read_text().splitlines():
        p = json.loads(line)
        payload = p["payload"]
        label = [x["label"] for x in payload] if isinstance(payload, list) else payload.get("label")
        predicted[p["instance_id"]] = label.split("|") if isinstance(label, str) else label
    return predicted, took_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=900)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-kinds-") as folder:
        tmp = Path(folder)
        write_bundle(tmp / "bundle", reviews(args.items, args.seed), scheme=SCHEME)
        rows = [json.loads(line) for line in (tmp / "bundle" / "test.jsonl").read_text().splitlines()]
        gold = {row["instance_id"]: row["targets"]["topics"] for row in rows}
        ours, ours_s = train("potato_queue.worker", tmp / "ours", tmp / "bundle", ["topics"])
        potato, potato_s = train("potato.training.worker", tmp / "potato", tmp / "bundle", [SCHEME])
    rows = [("potato-queue sklearn-text", score(gold, ours, MULTILABEL), ours_s),
            ("Potato 2.12.1 sklearn-text", score(gold, potato, MULTILABEL), potato_s)]
    print(f"Multi-label (multiselect of {len(TOPICS)} topics), {args.items} items, {len(gold)} in test:")
    print(f"{'':28} {'subset acc':>10} {'macro-F1':>9} {'micro-F1':>9} {'time':>7}")
    for name, scores, took_s in rows:
        print(f"{name:28} {scores['accuracy']:>10.3f} {scores['macro_f1']:>9.3f} {scores['micro_f1']:>9.3f} "
              f"{took_s:>6.1f}s")
    ratio = rows[0][1]["macro_f1"] / rows[1][1]["macro_f1"] if rows[1][1]["macro_f1"] else float("inf")
    print(f"macro-F1 ratio, potato-queue / Potato: {ratio:.2f}x (goal >= 1.0x)", flush=True)


if __name__ == "__main__":
    main()
