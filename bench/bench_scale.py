"""A project of any size: each phase's time and peak memory at 10k, 100k (and 1,000,000) items, and how it grows.

    .venv/bin/python bench/bench_scale.py [--sizes 10000,100000] [--skip-run] [--run-largest] [--keep DIR] [--quick]

--quick: 1,000 and 5,000 items, the run and its page at 5,000 only.

Generated Potato projects (review-like items in a JSON-lines data file, 5 annotators each answering half
the items in two radio schemes, a few percent careless), one per size. Each phase runs in a process of its
own, so its peak memory (ru_maxrss) is its own:

  parse         the alternative every build must beat: read the data file and every user_state.json and
                json-parse them, nothing else (the cycle collector paused, as the build pauses it)
  build         potato-queue's bundle, cold (bundle/: read, on a second core for the annotators' half,
                Dawid-Skene for the run's scheme, rows, splits)
  potato-build  Potato 2.12.1's own build_bundle on the same project (potato.training.dataset)
  reuse         what a run on unchanged data pays instead of a build: the inputs' digest (bundle/inputs.py)
The three time the call itself, as a run waits for it (the executor has its modules loaded and the config
read); the peak memory is the whole process's.
  splits        the run's split ids into Potato's store: ours (one transaction) against Potato's
                record_run_items called as Potato's manager calls it
  run           `potato-queue up CONFIG --run sklearn-text` end to end (a private Redis, the server, an
                executor, the local agent and worker): peak memory is the largest process's
  page          the run page's first paint as the browser asks for it (the run, its log, events, the
                predictions summary, quality, curve, what to label next, the runs list), against a
                `potato-queue serve` started for it: the server's seconds for all of them, and its memory
                idle and after

Prints a table per size, then the growth ratio of each phase per 10x of items (goal: at most 11), the
build against parse (goal: at most 1.5x) and against Potato's, the splits ratio, and the page's seconds
at the largest size (goal: under 1 s) and the server's memory after it against idle (goal: under 2x).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.quick import quick_args  # noqa: E402

ADMIN_KEY = "bench-admin-key-123"
ANNOTATORS = 5
WORDS = {
    "positive": ["great", "lovely", "superb", "moving", "sharp"],
    "negative": ["dull", "awful", "boring", "weak", "flat"],
    "neutral": ["fine", "okay", "average", "plain", "usual"],
}
FILLER = ["the", "film", "was", "and", "quite", "really", "story", "cast", "score", "ending", "long", "short"]


def make_project(folder: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    (folder / "data").mkdir(parents=True)
    truth = {}
    with (folder / "data" / "items.jsonl").open("w") as fh:
        for i in range(n):
            label, quality = rng.choice(list(WORDS)), rng.choice(["low", "mid", "high"])
            truth[f"i{i}"] = (label, quality)
            words = [rng.choice(WORDS[label]), f"{quality}budget", *rng.sample(FILLER, 5)]
            rng.shuffle(words)
            fh.write(json.dumps({"id": f"i{i}", "text": " ".join(words)}) + "\n")
    for a in range(ANNOTATORS):
        care = 0.95 if a < 3 else 0.7
        labels = {}
        for iid, (label, quality) in truth.items():
            if rng.random() < 0.5:
                said = label if rng.random() < care else rng.choice(list(WORDS))
                labels[iid] = [
                    [{"schema": "sentiment", "name": said}, said],
                    [{"schema": "quality", "name": quality}, quality],
                ]
        user = folder / "annotation_output" / f"annotator{a}"
        user.mkdir(parents=True)
        (user / "user_state.json").write_text(
            json.dumps({"user_id": f"annotator{a}", "instance_id_to_label_to_value": labels})
        )
    (folder / "config.yaml").write_text(f"""annotation_task_name: "Scale {n}"
task_dir: "."
data_files: ["data/items.jsonl"]
item_properties: {{id_key: "id", text_key: "text"}}
output_annotation_dir: "annotation_output"
admin_api_key: "{ADMIN_KEY}"
annotation_schemes:
  - {{annotation_type: radio, name: sentiment, description: "Sentiment", labels: [positive, negative, neutral]}}
  - {{annotation_type: radio, name: quality, description: "Budget", labels: [low, mid, high]}}
model_training:
  enabled: true
  writeback: {{schemas: [sentiment], include_unlabeled: true, min_confidence: 0.6}}
""")
    return folder / "config.yaml"


# ---------------------------------------------------------------- the phases, each in a process of its own


def phase_parse(config_path: Path) -> dict[str, Any]:
    gc.disable()  # the fastest plain read (the build pauses the cycle collector too)
    folder = config_path.parent
    with (folder / "data" / "items.jsonl").open(encoding="utf-8") as fh:
        items = [json.loads(line) for line in fh]
    states = [
        json.loads(p.read_text(encoding="utf-8"))
        for p in sorted((folder / "annotation_output").glob("*/user_state.json"))
    ]
    return {"items": len(items), "annotators": len(states)}


def phase_build(config_path: Path) -> dict[str, Any]:
    from potato_queue.bundle import build_bundle
    from potato_queue.validate import load_checked

    out, config = Path(tempfile.mkdtemp(prefix="pq-bundle-")), load_checked(config_path)
    started = time.perf_counter()
    manifest = build_bundle(config, out, ["sentiment"])
    seconds = time.perf_counter() - started
    shutil.rmtree(out)
    return {"train": manifest["splits"]["train"]["n"], "seconds_inner": seconds}


def phase_potato_build(config_path: Path) -> dict[str, Any]:
    from potato.export.cli import build_export_context
    from potato.training.dataset import build_bundle

    out, context = tempfile.mkdtemp(prefix="potato-bundle-"), build_export_context(str(config_path))
    started = time.perf_counter()
    _, stats, _ = build_bundle(context, out, ["sentiment"], include_unlabeled=True)
    seconds = time.perf_counter() - started
    shutil.rmtree(out)
    return {"annotated": stats.n_annotated, "seconds_inner": seconds}


def phase_reuse(config_path: Path) -> dict[str, Any]:
    from potato_queue.bundle.inputs import inputs_digest
    from potato_queue.validate import load_checked

    config = load_checked(config_path)
    started = time.perf_counter()
    digest = inputs_digest(config, ["sentiment"])
    return {"digest": digest[:12], "seconds_inner": time.perf_counter() - started}


def _split_ids(config_path: Path) -> dict[str, list[str]]:
    ids = [json.loads(line)["id"] for line in (config_path.parent / "data" / "items.jsonl").open()]
    n = len(ids)
    return {"train": ids[: int(n * 0.7)], "val": ids[int(n * 0.7) : int(n * 0.85)], "test": ids[int(n * 0.85) :]}


def _fresh_copy(config_path: Path) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="pq-splits-"))
    shutil.copy(config_path, folder / "config.yaml")
    (folder / "data").symlink_to(config_path.parent / "data")
    (folder / "annotation_output").mkdir()
    return folder / "config.yaml"


def phase_splits(config_path: Path) -> dict[str, Any]:
    from potato_queue.store.keys import new_run_id
    from potato_queue.store.potato_ledger import PotatoLedger
    from potato_queue.validate import load_checked

    splits, copy = _split_ids(config_path), _fresh_copy(config_path)
    ledger = PotatoLedger(load_checked(copy), log=lambda run_id, line: print(line))
    started = time.perf_counter()
    ledger.record_splits({"run_id": new_run_id(), "backend": "local"}, splits)
    seconds = time.perf_counter() - started
    shutil.rmtree(copy.parent)
    return {"seconds_inner": seconds}


def phase_potato_splits(config_path: Path) -> dict[str, Any]:
    from potato.training import store

    from potato_queue.store.keys import new_run_id
    from potato_queue.store.potato_ledger import potato_config
    from potato_queue.validate import load_checked

    splits, copy = _split_ids(config_path), _fresh_copy(config_path)
    cfg = potato_config(load_checked(copy))
    store.list_runs(cfg)  # Potato's tables made, as in a project Potato has run on
    started = time.perf_counter()
    store.record_run_items(cfg, new_run_id(), splits)
    seconds = time.perf_counter() - started
    shutil.rmtree(copy.parent)
    return {"seconds_inner": seconds}


PHASES = {
    "parse": phase_parse,
    "build": phase_build,
    "potato-build": phase_potato_build,
    "reuse": phase_reuse,
    "splits": phase_splits,
    "potato-splits": phase_potato_splits,
}


def run_phase(name: str, config_path: Path) -> tuple[float, float]:
    """(seconds, peak MB) of one phase in a fresh process; an 'inner' time where the phase measures its own."""
    code = (
        f"import json, resource, sys, time; sys.path.insert(0, {str(ROOT)!r}); from bench.bench_scale import PHASES; "
        f"from pathlib import Path; t = time.perf_counter(); out = PHASES[{name!r}](Path({str(config_path)!r})); "
        "s = out.get('seconds_inner', time.perf_counter() - t); "
        "print(json.dumps({'s': s, 'mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return float(found["s"]), float(found["mb"])


def _private_redis_env() -> dict[str, str]:
    # An address nothing answers on: `up` starts a private Redis; the machine's own is never touched.
    return {**os.environ, "POTATO_QUEUE_REDIS_URL": "redis://127.0.0.1:1/0", "HF_HUB_OFFLINE": "1"}


def run_end_to_end(config_path: Path) -> tuple[float, float, str]:
    """(seconds, peak MB of the largest process, run id) of `up --run sklearn-text`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "potato-queue"), "up", str(config_path), "--port", "0", "--run", "sklearn-text"],
        capture_output=True,
        text=True,
        env=_private_redis_env(),
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    peak = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    runs = sorted((config_path.parent / "annotation_output" / "training" / "runs").iterdir())
    return seconds, peak, runs[-1].name


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


PAGE_PATHS = [
    "/runs/{run}",
    "/runs/{run}/log?offset=0",
    "/runs/{run}/events?after=0",
    "/runs/{run}/predictions/summary",
    "/runs/{run}/quality?target_precision=0.9",
    "/runs/{run}/curve",
    "/runs/{run}/next?limit=20",
    "/runs?limit=200",
]


def page_first_paint(config_path: Path, run_id: str) -> tuple[float, float, float, dict[str, float]]:
    """(server seconds for the page's first requests, RSS idle MB, RSS after MB, seconds per request)."""
    from potato_queue.processes.embedded_redis import EmbeddedRedis

    with tempfile.TemporaryDirectory() as folder, EmbeddedRedis(folder) as own:
        env = {**_private_redis_env(), "POTATO_QUEUE_REDIS_URL": own.url}
        server = subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "potato-queue"), "serve", str(config_path), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            base = line.rsplit(" at ", 1)[1].strip() + "/admin/training/api"
            time.sleep(1.0)  # settled: the first garbage collection, the imports done
            idle = _rss_mb(server.pid)
            timings: dict[str, float] = {}
            rss: dict[str, float] = {}
            for path in PAGE_PATHS:
                url = base + path.format(run=run_id)
                request = urllib.request.Request(url, headers={"X-API-Key": ADMIN_KEY})
                started = time.perf_counter()
                try:
                    with urllib.request.urlopen(request, timeout=300) as reply:
                        reply.read()
                except urllib.error.HTTPError as exc:
                    if not (exc.code == 409 and "/curve" in path):  # no learning curve: the page hides it
                        raise
                timings[path.split("?")[0].replace("{run}", "R")] = time.perf_counter() - started
                rss[path.split("?")[0].replace("{run}", "R")] = _rss_mb(server.pid)
            print("  server MB after each request: " + ", ".join(f"{p} {mb:.0f}" for p, mb in rss.items()))
            return sum(timings.values()), idle, _rss_mb(server.pid), timings
        finally:
            server.terminate()
            server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--skip-run", action="store_true", help="the bundle and store phases only")
    parser.add_argument("--keep", type=Path, help="make the projects here and keep them")
    parser.add_argument("--run-largest", action="store_true", help="the run and its page at the largest size only")
    args = quick_args(parser, sizes="1000,5000", run_largest=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    root = args.keep or Path(tempfile.mkdtemp(prefix="pq-scale-"))
    results: dict[int, dict[str, tuple[float, float]]] = {}
    page: dict[int, tuple[float, float, float, dict[str, float]]] = {}
    try:
        for n in sizes:
            folder = root / f"p{n}"
            config = folder / "config.yaml" if folder.exists() else make_project(folder, n)
            results[n] = {name: run_phase(name, config) for name in PHASES}
            if not args.skip_run and (n == sizes[-1] or not args.run_largest):
                seconds, peak, run_id = run_end_to_end(config)
                results[n]["run"] = (seconds, peak)
                page[n] = page_first_paint(config, run_id)
                results[n]["page"] = (page[n][0], page[n][2])
            print(f"\n{n:,} items ({ANNOTATORS} annotators, two schemes)")
            print(f"  {'phase':14} {'seconds':>9} {'peak MB':>9}")
            for name, (s, mb) in results[n].items():
                print(f"  {name:14} {s:9.2f} {mb:9.0f}")
            if n in page:
                print("  page requests: " + ", ".join(f"{p} {s:.2f}s" for p, s in page[n][3].items()))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    _summary(sizes, results, page)


def _summary(
    sizes: list[int],
    results: dict[int, dict[str, tuple[float, float]]],
    page: dict[int, tuple[float, float, float, dict[str, float]]],
) -> None:
    print("\ngrowth per 10x of items (time; goal at most 11):")
    for small, large in zip(sizes, sizes[1:], strict=False):
        tens = max(1e-9, math.log10(large / small))  # 10k -> 1M is two steps of 10x: the ratio per step
        ratios = {
            name: (results[large][name][0] / max(results[small][name][0], 1e-9)) ** (1 / tens)
            for name in results[large]
            if name in results[small]
        }
        print(f"  {small:,} -> {large:,}: " + ", ".join(f"{name} {r:.1f}" for name, r in ratios.items()))
    for n in sizes:
        r = results[n]
        print(
            f"{n:,}: build / parse {r['build'][0] / r['parse'][0]:.2f}x (goal at most 1.5x); build vs Potato's "
            f"{r['potato-build'][0] / r['build'][0]:.1f}x faster; reuse / build {r['reuse'][0] / r['build'][0]:.2f}x; "
            f"splits vs Potato's record_run_items {r['potato-splits'][0] / max(r['splits'][0], 1e-9):.1f}x faster"
        )
        if n in page:
            print(
                f"{n:,}: the run page's first paint {page[n][0]:.2f} s of server work (goal under 1 s); server "
                f"memory {page[n][1]:.0f} MB idle, {page[n][2]:.0f} MB after ({page[n][2] / page[n][1]:.2f}x; goal under 2x)"
            )


if __name__ == "__main__":
    main()
