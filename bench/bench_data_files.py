"""Reading a project's items from every data format Potato reads, against Potato 2.12.1's own server parser.

For N items written as CSV, TSV, JSON Lines, a JSON array and Parquet, the time potato-queue's reader
(bundle/data_files.py, with Potato's refusals: ids checked, duplicates refused) takes against Potato's own
(`potato.data_sources.parsing` for text formats, pyarrow to pandas records for Parquet, what its server
runs), each the best of three, and the ratio; then a CSV project's whole bundle (three annotators) against
Potato's own build_bundle fed the items its server reads.

    .venv/bin/python bench/bench_data_files.py [--items 100000] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from bench.quick import quick_args  # noqa: E402

WORDS = "the a film plot actor scene music long short good bad great dull fine".split()


def best_s(work: Callable[[], Any], times: int = 3) -> float:
    best = float("inf")
    for _ in range(times):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def write_items(folder: Path, n: int) -> dict[str, Path]:
    rng = random.Random(0)
    items = [{"id": f"{i:07d}", "text": " ".join(rng.choices(WORDS, k=12)) + ", then more"} for i in range(n)]
    paths = {fmt: folder / f"items.{fmt}" for fmt in ("csv", "tsv", "jsonl", "json", "parquet")}
    with paths["csv"].open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "text"])
        writer.writerows([item["id"], item["text"]] for item in items)
    paths["tsv"].write_text("id\ttext\n" + "".join(f"{item['id']}\t{item['text']}\n" for item in items))
    paths["jsonl"].write_text("".join(json.dumps(item) + "\n" for item in items))
    paths["json"].write_text(json.dumps(items))
    import pandas as pd

    pd.DataFrame(items).to_parquet(paths["parquet"])
    return paths


def potatos_reader(path: Path) -> Callable[[], Any]:
    from potato.data_sources.parsing import parse_delimited, parse_json_records, read_text

    fmt = path.suffix[1:]
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return lambda: pq.read_table(path).to_pandas().astype({"id": str, "text": str}).to_dict("records")
    if fmt in ("csv", "tsv"):
        return lambda: parse_delimited(read_text(str(path)), "," if fmt == "csv" else "\t", str(path))
    if fmt == "jsonl":
        return lambda: [json.loads(line) for line in read_text(str(path)).splitlines() if line.strip()]
    return lambda: parse_json_records(read_text(str(path)), str(path), json_array=True)


def project(folder: Path, data_file: str) -> Path:
    config = {
        "task_dir": ".",
        "data_files": [data_file],
        "annotation_schemes": [{"annotation_type": "radio", "name": "s", "description": "d", "labels": ["x", "y"]}],
        "model_training": {"enabled": True},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder / "config.yaml"


def read_figures(folder: Path, paths: dict[str, Path], n: int) -> None:
    from potato_queue.bundle import read
    from potato_queue.validate import load_checked

    for fmt, path in paths.items():
        config = load_checked(project(folder, path.name))
        ours = best_s(lambda config=config: read.read_items(config))
        theirs = best_s(potatos_reader(path))
        print(
            f"{fmt:<8} {n:,} items: potato-queue {ours:.3f} s, Potato's parser {theirs:.3f} s, ratio {ours / theirs:.2f}"
        )


def bundle_figure(folder: Path, paths: dict[str, Path], n: int) -> None:
    from potato.data_sources.parsing import parse_delimited, read_text
    from potato.export.cli import build_export_context
    from potato.training.dataset import build_bundle as potatos_build

    from potato_queue.bundle import build_bundle
    from potato_queue.validate import load_checked

    config_path = project(folder, paths["csv"].name)
    rng = random.Random(1)
    ids = [row["id"] for row in parse_delimited(read_text(str(paths["csv"])), ",")]
    for user in ("ann", "ben", "cai"):
        answers = {iid: [[{"schema": "s", "name": label}, label]] for iid in ids for label in [rng.choice("xy")]}
        (folder / "annotation_output" / user).mkdir(parents=True, exist_ok=True)
        (folder / "annotation_output" / user / "user_state.json").write_text(
            json.dumps({"user_id": user, "instance_id_to_label_to_value": answers})
        )
    config = load_checked(config_path)
    ours = best_s(lambda: build_bundle(config, folder / "ours", ["s"]), times=1)

    def potatos() -> None:
        context = build_export_context(str(config_path))
        context.items = {row["id"]: row for row in parse_delimited(read_text(str(paths["csv"])), ",")}
        potatos_build(context, str(folder / "potato"), ["s"])

    theirs = best_s(potatos, times=1)
    same = (
        json.loads((folder / "ours" / "manifest.json").read_text())["digest"]
        == json.loads((folder / "potato" / "manifest.json").read_text())["digest"]
    )
    print(
        f"CSV project bundle, {n:,} items, 3 annotators: potato-queue {ours:.2f} s, Potato's build_bundle "
        f"{theirs:.2f} s, ratio {ours / theirs:.2f} (same digest: {same})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    args = quick_args(parser, items=2_000)
    with tempfile.TemporaryDirectory(prefix="bench-data-files-") as tmp:
        folder = Path(tmp)
        paths = write_items(folder, args.items)
        read_figures(folder, paths, args.items)
        bundle_figure(folder, paths, args.items)


if __name__ == "__main__":
    main()
