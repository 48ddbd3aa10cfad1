"""hf-llm-lora and checkpoints, run as users' machines run the worker: `python -m potato_queue.worker`.

The model is a tiny Llama (or Qwen2) built here with a tokenizer trained on the example project's
texts (tests/tiny_llm.py, conftest's tiny_llm): the real loading, LoRA, checkpoint and resume code runs on it, on the CPU. No GPU
exists here: the 4-bit path is exercised by bench/gpu_check.py on a GPU machine, and here only its
refusal on a CPU is.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.trainers.test_worker import (
    ROOT,
    SCHEMA,
    Run,
    assert_predictions,
    assert_well_formed,
    run_worker,
    synthetic_items,
    worker_env,
    write_bundle,
    write_spec,
)
from tests.tiny_llm import build_tiny_llm


def llm_params(model: Path, **extra: Any) -> dict[str, Any]:
    return {
        "model_name": str(model),
        "epochs": 2,
        "batch_size": 4,
        "grad_accum_steps": 2,
        "max_length": 4,
        "learning_rate": 5e-3,
        "lora": {"r": 4, "alpha": 8},
        **extra,
    }


def test_a_tiny_llama_fine_tunes_with_lora_and_the_adapter_is_the_model_file(tmp_path: Path, tiny_llm: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    run = run_worker(write_spec(tmp_path, bundle, "hf-llm-lora", llm_params(tiny_llm)))
    assert run.returncode == 0, run.stderr[-3000:]
    assert_well_formed(run)
    assert_predictions(tmp_path / "work", bundle, run)
    saved = tmp_path / "work" / SCHEMA
    adapter = json.loads((saved / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and sorted(adapter["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert "score" in adapter["modules_to_save"] or "classifier" in str(adapter["modules_to_save"])
    assert not (saved / "model.safetensors").exists(), "the base weights stay out of the model files"
    notes = run.only("result")["notes"]
    assert notes[1] == "LoRA r=4 alpha=8 on k_proj, o_proj, q_proj, v_proj; the adapter is the saved model", notes
    logs = [e["msg"] for e in run.of("log")]
    assert any(
        "train items for sentiment are longer than max_length (4 tokens) and were cut to it" in m for m in logs
    ), logs
    card = json.loads((tmp_path / "work" / "model_card.json").read_text())
    assert card["schemas"][SCHEMA]["precision"] == "fp32" and card["schemas"][SCHEMA]["load_in_4bit"] is False
    train = [e for e in run.of("progress") if e["phase"] == "train"]
    # 26 train items, batches of 4 = 7 batches, 2 per update = 4 updates an epoch, 2 epochs.
    assert train[-1]["current"] == train[-1]["total"] == 8, train[-1]
    assert not (tmp_path / "checkpoints").exists(), "a finished run keeps no checkpoint"


def test_merge_saves_a_plain_transformers_model(tmp_path: Path, tiny_llm: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    run = run_worker(write_spec(tmp_path, bundle, "hf-llm-lora", llm_params(tiny_llm, merge=True, epochs=1)))
    assert run.returncode == 0, run.stderr[-3000:]
    saved = tmp_path / "work" / SCHEMA
    assert (saved / "model.safetensors").is_file() and not (saved / "adapter_config.json").exists()
    assert json.loads((saved / "config.json").read_text())["architectures"] == ["LlamaForSequenceClassification"]


def test_a_qwen2_gets_its_family_targets(tmp_path: Path) -> None:
    model = build_tiny_llm(tmp_path / "qwen", [item["text"] for item in synthetic_items()], family="qwen2")
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    run = run_worker(write_spec(tmp_path, bundle, "hf-llm-lora", llm_params(model, epochs=1)))
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((tmp_path / "work" / SCHEMA / "adapter_config.json").read_text())[
        "base_model_name_or_path"
    ] == str(model)


def test_4bit_on_a_machine_without_cuda_is_refused_with_the_fix(tmp_path: Path, tiny_llm: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    run = run_worker(write_spec(tmp_path, bundle, "hf-llm-lora", llm_params(tiny_llm, load_in_4bit=True)))
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.only("error")["message"] == (
        "params.load_in_4bit is true, but 4-bit base weights (bitsandbytes) need a CUDA GPU and this run's device "
        "is cpu; fix: run on a backend with a GPU, or set params.load_in_4bit: false (or auto) to train the base "
        "weights in full precision"
    )


def run_until(
    spec: Path, step: int, act: Callable[[subprocess.Popen[str]], None], env: dict[str, str] | None = None
) -> Run:
    """Start the worker as the agent does (leading a process group); at train progress `step`, act(worker)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "potato_queue.worker", "--spec", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or worker_env(),
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            event = json.loads(line)
            if event["event"] == "progress" and event["phase"] == "train" and event["current"] == step:
                act(proc)
                break
        rest, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return Run(proc.returncode, "".join(lines) + rest, stderr)


def _preempt_after(spec: Path, step: int) -> Run:
    """At train progress `step`, SIGUSR1 (what SLURM's --signal sends ahead of a preemption)."""
    return run_until(spec, step, lambda proc: proc.send_signal(signal.SIGUSR1))


def test_preempted_mid_training_it_checkpoints_exits_6_and_the_rerun_resumes_to_the_same_model(
    tmp_path: Path, tiny_llm: Path
) -> None:
    """The SLURM requeue's worker side: SIGUSR1, a checkpoint, exit 6; the same spec run again resumes at that
    step and ends with the adapter a run never stopped ends with, byte for byte."""
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    params = llm_params(tiny_llm, epochs=3, checkpoint_every_steps=100, lora={"r": 4, "alpha": 8, "dropout": 0.1})
    (tmp_path / "whole").mkdir()
    whole = run_worker(write_spec(tmp_path / "whole", bundle, "hf-llm-lora", params))
    assert whole.returncode == 0, whole.stderr[-3000:]

    (tmp_path / "cut").mkdir()
    spec = write_spec(tmp_path / "cut", bundle, "hf-llm-lora", params)
    preempted = _preempt_after(spec, 5)
    assert preempted.returncode == 6, preempted.stderr[-3000:]
    assert preempted.of("status")[-1]["state"] == "preempted"
    assert not preempted.of("result") and not preempted.of("error")
    saved = [e["msg"] for e in preempted.of("log") if e["msg"].startswith("checkpoint saved")]
    step = int(saved[-1].rsplit(" ", 1)[1])
    assert step >= 5 and (tmp_path / "cut" / "checkpoints" / f"step-{step}" / "DONE").is_file()

    resumed = run_worker(spec)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logs = [e["msg"] for e in resumed.of("log")]
    assert any(m.startswith(f"resumed at step {step} from the checkpoint in ") for m in logs), logs
    train = [e for e in resumed.of("progress") if e["phase"] == "train"]
    assert train[0]["current"] == step + 1 and train[-1]["current"] == 12, (train[0], train[-1])
    adapter = f"{SCHEMA}/adapter_model.safetensors"
    assert (tmp_path / "cut" / "work" / adapter).read_bytes() == (tmp_path / "whole" / "work" / adapter).read_bytes()
    assert resumed.only("result")["metrics"]["test_accuracy"] == whole.only("result")["metrics"]["test_accuracy"]


def _with_a_second_schema(bundle: Path) -> None:
    """A second radio scheme beside the fixture's, its answer the sentiment's but every third one flipped."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["schemas"].append({**manifest["schemas"][0], "name": "second"})
    manifest["labels"]["second"] = manifest["labels"][SCHEMA]
    for split in ("train", "val", "test"):
        rows = [json.loads(line) for line in (bundle / f"{split}.jsonl").read_text().splitlines()]
        for i, row in enumerate(rows):
            answer = row["targets"][SCHEMA]
            row["targets"]["second"] = answer if i % 3 else {"positive": "negative", "negative": "positive"}[answer]
        (bundle / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    (bundle / "labels.json").write_text(json.dumps(manifest["labels"]))


def test_a_checkpoint_of_a_schemas_last_update_resumes_that_schema_not_its_saved_model(
    tmp_path: Path, tiny_llm: Path
) -> None:
    """A checkpoint at the first schema's last update, and no model of it saved (a preemption there stops the
    run before it is): the rerun resumes that schema from the checkpoint, with nothing left to train, and
    ends with the models a run never stopped ends with (it looked for the saved model, and failed)."""
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    _with_a_second_schema(bundle)
    # 26 train items in batches of 4, 2 a step: 4 steps an epoch, 8 a schema; a checkpoint at each one's end.
    params = llm_params(tiny_llm, epochs=2, checkpoint_every_steps=8, lora={"r": 4, "alpha": 8, "dropout": 0.1})
    schemas = {"schemas": [SCHEMA, "second"]}
    (tmp_path / "whole").mkdir()
    whole = run_worker(write_spec(tmp_path / "whole", bundle, "hf-llm-lora", params, **schemas))
    assert whole.returncode == 0, whole.stderr[-3000:]

    (tmp_path / "cut").mkdir()
    spec = write_spec(tmp_path / "cut", bundle, "hf-llm-lora", params, **schemas)
    killed = run_until(spec, 9, lambda proc: os.killpg(proc.pid, signal.SIGKILL))
    assert "checkpoint saved at step 8" in [e["msg"] for e in killed.of("log")], killed.stderr[-3000:]
    shutil.rmtree(tmp_path / "cut" / "work")  # as if preempted at step 8: no model of the first schema saved

    resumed = run_worker(spec)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [e["current"] for e in resumed.of("progress") if e["phase"] == "train"][0] == 9
    for schema in (SCHEMA, "second"):
        adapter = f"{schema}/adapter_model.safetensors"
        assert (tmp_path / "cut" / "work" / adapter).read_bytes() == (
            tmp_path / "whole" / "work" / adapter
        ).read_bytes(), schema


def test_a_preemption_before_the_loop_exits_6_with_nothing_to_save(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    spec = write_spec(tmp_path, bundle, "majority-baseline", {"hold_s": 30, "checkpoint_every_steps": 1})
    proc = subprocess.Popen(
        [sys.executable, "-m", "potato_queue.worker", "--spec", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=worker_env(),
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # the first status: the worker has started and its handlers are in
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    run = Run(proc.returncode, out, err)
    assert run.returncode == 6, err[-2000:]
    assert run.of("status")[-1]["state"] == "preempted"


def test_majority_baseline_holds_only_the_rest_after_a_preemption(tmp_path: Path) -> None:
    """The torch-free trainer the SLURM tests preempt: its checkpoint is the seconds it has held."""
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    spec = write_spec(tmp_path, bundle, "majority-baseline", {"hold_s": 4, "checkpoint_every_steps": 1})
    preempted = _preempt_after(spec, 2)
    assert preempted.returncode == 6, preempted.stderr[-2000:]
    resumed = run_worker(spec)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert any(e["msg"].startswith("resumed at step 2 from the checkpoint") for e in resumed.of("log"))
    held = [e for e in resumed.of("progress") if e["phase"] == "train"]
    assert held[0]["current"] == 2 and held[0]["eta_s"] <= 2.0, held[0]  # it holds only the rest


def test_a_bad_checkpoint_every_steps_is_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    run = run_worker(write_spec(tmp_path, bundle, "majority-baseline", {"checkpoint_every_steps": -3}))
    assert run.returncode == 2
    assert run.only("error")["message"] == (
        "params.checkpoint_every_steps must be a whole number of steps, 0 for none, got -3"
    )
