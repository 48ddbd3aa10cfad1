"""Whether an LLM fine-tune fits a GPU (host/llm_fit.py): the size from config.json, the need, the verdict.

The sizes are checked against transformers itself: each config is built into its real model class on
torch's meta device (no memory, no download), and its parameters counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from potato_queue.host.check import find_model_config
from potato_queue.host.llm_fit import ModelAsk, fit_lines, fit_of_facts, need_mb, parameter_count

pytestmark = pytest.mark.unit

# The published configs' fields that decide the size (Qwen2.5-0.5B, Llama-3.2-1B, Mistral-7B-v0.1, Phi-3-mini).
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "llama": {
        "model_type": "llama",
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "tie_word_embeddings": True,
    },
    "mistral": {
        "model_type": "mistral",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "phi3": {
        "model_type": "phi3",
        "hidden_size": 3072,
        "num_hidden_layers": 32,
        "intermediate_size": 8192,
        "vocab_size": 32064,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "tie_word_embeddings": False,
    },
}


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_the_size_from_config_json_is_the_models_own_within_a_percent(family: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(CONFIGS[family])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    real = sum(p.numel() for p in model.parameters())
    estimate = parameter_count(CONFIGS[family])
    assert estimate is not None and abs(estimate - real) / real < 0.01, (family, estimate, real)


def test_a_config_without_the_sizes_says_unknown() -> None:
    assert parameter_count({"model_type": "bert", "hidden_size": 32}) is None


def test_a_7b_model_fits_an_a100_in_4bit_and_not_a_small_gpu_in_bf16() -> None:
    mistral = CONFIGS["mistral"]
    four_bit = need_mb(parameter_count(mistral) or 0, four_bit=True)
    assert 4000 < four_bit < 7000, four_bit  # QLoRA of a 7B model: about 5 GB with its context
    fits, lines = fit_lines(ModelAsk("mistralai/Mistral-7B-v0.1", "true"), mistral, [(0, 1200.0), (1, 70000.0)], True)
    assert fits and lines == [
        f"hf-llm-lora: mistralai/Mistral-7B-v0.1 (7.24 B parameters) in 4-bit: about "
        f"{four_bit:.0f} MB needed; GPU 1 has 70000 MB free"
    ], lines
    fits, lines = fit_lines(ModelAsk("mistralai/Mistral-7B-v0.1", "false"), mistral, [(0, 12000.0)], True)
    assert not fits and lines[-1].endswith(
        "more than the 12000 MB free on GPU 0; fix: set load_in_4bit: true, or free memory on the GPU"
    ), lines


def test_4bit_needs_a_gpu_and_bitsandbytes_and_auto_says_what_it_falls_back_to() -> None:
    ask = ModelAsk("Qwen/Qwen2.5-0.5B", "true")
    assert fit_lines(ask, CONFIGS["qwen2"], [], True) == (
        False,
        ["hf-llm-lora: load_in_4bit needs a CUDA GPU, and this host has none"],
    )
    fits, lines = fit_lines(ask, CONFIGS["qwen2"], [(0, 20000.0)], False)
    assert not fits and lines[0].startswith("hf-llm-lora: load_in_4bit needs bitsandbytes")
    fits, lines = fit_lines(ask._replace(load_in_4bit="auto"), CONFIGS["qwen2"], [(0, 20000.0)], False)
    assert fits and lines[0] == "hf-llm-lora: no bitsandbytes here, so the base weights load in bf16, not 4-bit"
    assert "in bf16" in lines[1]


def test_the_fit_is_judged_from_what_a_backends_check_reported() -> None:
    """runs/check.py's call: the executor reports facts (JSON, as they cross ssh), the fit is judged here."""
    ask = ModelAsk("mistralai/Mistral-7B-v0.1", "true")
    facts = {"model_config": CONFIGS["mistral"], "gpus": [[0, 1200.0], [1, 70000.0]], "bitsandbytes": True}
    assert fit_of_facts(ask, facts) == fit_lines(ask, CONFIGS["mistral"], [(0, 1200.0), (1, 70000.0)], True)
    assert fit_of_facts(ask, {**facts, "gpus": [[0, 1200.0]]})[0] is False
    # A SLURM login node: the job's GPU is the scheduler's choice, so the need is said, not judged.
    fits, lines = fit_of_facts(ask, {"model_config": CONFIGS["mistral"], "gpus": None})
    assert fits and lines[0].startswith("hf-llm-lora: mistralai/Mistral-7B-v0.1 (7.24 B parameters) needs about ")
    assert lines[0].endswith(
        "of the job's GPU in 4-bit (ask for it with gres or mem_per_gpu); the trainer checks it "
        "on the node before it loads the weights"
    )
    assert fit_of_facts(ask, {"model_config": None, "gpus": None}) == (
        True,
        [
            "hf-llm-lora: mistralai/Mistral-7B-v0.1's size is unknown here; the trainer checks its fit on the compute "
            "node's GPU before it loads the weights"
        ],
    )


def test_the_config_is_found_in_a_folder_or_the_hugging_face_cache_and_never_fetched(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 8}')
    assert find_model_config(str(folder)) == {"hidden_size": 8}
    snapshot = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-0.5B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"hidden_size": 896}')
    assert find_model_config("Qwen/Qwen2.5-0.5B", hf_home=str(tmp_path / "hf")) == {"hidden_size": 896}
    assert find_model_config("Qwen/Qwen2.5-7B", hf_home=str(tmp_path / "hf")) is None
