"""Whether an LLM fine-tune fits a GPU: the model's size from its config.json, and the memory that needs.

Standard library only, Python 3.8+, pure functions: `training check` asks them
on the server with what a host said (its GPUs, its packages, the model's
config.json where the host has it: host/check.py's find_model_config), and hf-llm-lora asks them on the GPU
before it loads the weights, so that a model too large is refused in a
second, not after minutes of loading. The estimate is deliberately plain:
the weights (4-bit nf4 with its scales, or bf16), a fifth more for the
adapters, the optimiser and activations under gradient checkpointing, and
CUDA's own context.
"""

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

__all__ = ["ModelAsk", "parameter_count", "need_mb", "fit_lines", "compute_node_line", "fit_of_facts", "CONTEXT_MB"]

MIB = 1024 * 1024
CONTEXT_MB = 1500  # CUDA's context, cuBLAS workspaces and the allocator's slack
OVERHEAD = 1.2  # LoRA weights, their AdamW state, activations with gradient checkpointing at the default batch
BYTES_PER_PARAM = {True: 0.55, False: 2.0}  # nf4 (half a byte) plus its double-quantised scales; bf16
_GATED_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "olmo", "granite", "phi3")


class ModelAsk(NamedTuple):
    """What `training check --trainer hf-llm-lora` asks of a backend: this model, in 4-bit or not."""

    model_name: str
    load_in_4bit: str  # "auto", "true", "false" (the trainer's param)


def parameter_count(config: Dict[str, Any]) -> Optional[int]:
    """A decoder's parameters from its transformers config.json; None when the config does not say enough."""
    try:
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        inner, vocab = int(config["intermediate_size"]), int(config["vocab_size"])
        heads = int(config["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        return None
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    gated = config.get("model_type") in _GATED_FAMILIES or config.get("hidden_act") in ("silu", "swiglu")
    mlp = (3 if gated else 2) * hidden * inner * int(config.get("num_local_experts") or 1)
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
    return embeddings + layers * (attention + mlp)


def need_mb(parameters: int, four_bit: bool) -> float:
    """The GPU memory a LoRA fine-tune of that many parameters needs, about."""
    return parameters * BYTES_PER_PARAM[four_bit] * OVERHEAD / MIB + CONTEXT_MB


def fit_lines(
    ask: ModelAsk, config: Optional[Dict[str, Any]], gpus_free_mb: Sequence[Tuple[int, float]], has_bitsandbytes: bool
) -> Tuple[bool, List[str]]:
    """(whether the best GPU fits it, what to say): 4-bit needs CUDA and bitsandbytes; the need against the
    most free memory of the GPUs a run may get."""
    lines = []  # type: List[str]
    four_bit = ask.load_in_4bit == "true" or (ask.load_in_4bit == "auto" and bool(gpus_free_mb) and has_bitsandbytes)
    if ask.load_in_4bit == "true" and not gpus_free_mb:
        return False, ["hf-llm-lora: load_in_4bit needs a CUDA GPU, and this host has none"]
    if four_bit and not has_bitsandbytes:
        return False, [
            "hf-llm-lora: load_in_4bit needs bitsandbytes, which this host's Python lacks: "
            "pip install bitsandbytes there (on an ssh backend, add it to packages:)"
        ]
    if ask.load_in_4bit == "auto" and gpus_free_mb and not has_bitsandbytes:
        lines.append("hf-llm-lora: no bitsandbytes here, so the base weights load in bf16, not 4-bit")
    parameters = None if config is None else parameter_count(config)
    if parameters is None:
        lines.append(
            "hf-llm-lora: {}'s config.json is not on this host (nor in its Hugging Face cache): its size, "
            "and so its need, are unknown until the run loads it".format(ask.model_name)
        )
        return True, lines
    need = need_mb(parameters, four_bit)
    what = "{} ({:.2f} B parameters) in {}: about {:.0f} MB".format(
        ask.model_name, parameters / 1e9, "4-bit" if four_bit else "bf16", need
    )
    if not gpus_free_mb:
        return True, lines + ["hf-llm-lora: {} on a GPU; this host has none, so it trains on the CPU".format(what)]
    index, free_mb = max(gpus_free_mb, key=lambda gpu: gpu[1])
    if need > free_mb:
        fix = "set load_in_4bit: true" if not four_bit else "use a smaller model"
        return False, lines + [
            "hf-llm-lora: {} needed, more than the {:.0f} MB free on GPU {}; fix: {}, or free memory on the GPU".format(
                what, free_mb, index, fix
            )
        ]
    return True, lines + ["hf-llm-lora: {} needed; GPU {} has {:.0f} MB free".format(what, index, free_mb)]


def compute_node_line(ask: ModelAsk, config: Optional[Dict[str, Any]]) -> str:
    """A SLURM login node cannot see a job's GPU: the need, where the model's config is on shared storage; the
    trainer compares it with its GPU on the node before it loads the weights."""
    parameters = None if config is None else parameter_count(config)
    if parameters is None:
        return (
            "hf-llm-lora: {}'s size is unknown here; the trainer checks its fit on the compute node's GPU "
            "before it loads the weights".format(ask.model_name)
        )
    four_bit = ask.load_in_4bit != "false"
    return (
        "hf-llm-lora: {} ({:.2f} B parameters) needs about {:.0f} MB of the job's GPU in {} (ask for it with "
        "gres or mem_per_gpu); the trainer checks it on the node before it loads the weights".format(
            ask.model_name, parameters / 1e9, need_mb(parameters, four_bit), "4-bit" if four_bit else "bf16"
        )
    )


def fit_of_facts(ask: ModelAsk, facts: Dict[str, Any]) -> Tuple[bool, List[str]]:
    """fit_lines of what a backend's check saw (its `llm_facts`: the model's config, the GPUs a run may get
    as [index, free MB] pairs, None where a scheduler picks them, and whether bitsandbytes imports)."""
    if facts.get("gpus") is None:
        return True, [compute_node_line(ask, facts.get("model_config"))]
    gpus = [(int(index), float(free_mb)) for index, free_mb in facts["gpus"]]
    return fit_lines(ask, facts.get("model_config"), gpus, bool(facts.get("bitsandbytes")))
