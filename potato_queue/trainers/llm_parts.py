"""The pieces of ``hf-llm-lora`` that touch torch, transformers, peft and bitsandbytes.

Loading a decoder with a classification head (4-bit base weights where CUDA
is there), LoRA with per-family targets, the precision a device can train in,
and a saved adapter put back (the rest of a checkpoint is fine_tune.py's).
Imported only inside the worker, after the trainer's packages were imported
(loading.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from potato_queue.worker.errors import MissingDependency, ValidationFailed

__all__ = [
    "LORA_TARGETS",
    "Precision",
    "precision_for",
    "refuse_4bit",
    "load_classifier",
    "apply_lora",
    "load_adapter",
    "count_truncated",
    "has_bitsandbytes",
    "gpu_room_problem",
    "BITSANDBYTES_HINT",
]

# Per model family (config.model_type): the attention projections, which QLoRA-style fine-tunes adapt by
# default. A family not here gets peft's own default, then every linear layer.
LORA_TARGETS: dict[str, list[str]] = {
    **{
        family: ["q_proj", "k_proj", "v_proj", "o_proj"]
        for family in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "olmo", "granite")
    },
    "phi3": ["qkv_proj", "o_proj"],
    "phi": ["q_proj", "k_proj", "v_proj", "dense"],
}


@dataclass(frozen=True)
class Precision:
    """What the forward pass runs in: an autocast dtype (None: fp32) and whether fp16's loss scaling is on."""

    name: str  # "bf16", "fp16", "fp32"
    autocast_dtype: Any
    scale_loss: bool

    def autocast(self, device: str) -> Any:
        """The forward pass's context: autocast to this precision's dtype, or nothing for fp32."""
        import torch

        return torch.autocast(device.split(":")[0], dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None)


def precision_for(asked: str, device: str) -> Precision:
    """`auto`: bf16 on a GPU that has it, else fp16 on a GPU; fp32 on a CPU (autocast there is slow)."""
    import torch

    cuda = device.startswith("cuda")
    if asked == "auto":
        asked = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32"
    if asked == "fp16" and not cuda:
        raise ValidationFailed(
            f"params.precision fp16 needs a CUDA GPU; this run's device is {device}: "
            "use precision: bf16 or fp32 (or auto)"
        )
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[asked]
    return Precision(asked, dtype, asked == "fp16")


def refuse_4bit(device: str) -> str | None:
    """Why 4-bit base weights cannot be used here, with the fix; None when they can."""
    if not device.startswith("cuda"):
        return (
            f"params.load_in_4bit is true, but 4-bit base weights (bitsandbytes) need a CUDA GPU and this "
            f"run's device is {device}; fix: run on a backend with a GPU, or set params.load_in_4bit: false "
            "(or auto) to train the base weights in full precision"
        )
    return None


BITSANDBYTES_HINT = (
    "pip install bitsandbytes into the Python that runs the worker on the GPU host (on an ssh "
    "backend, add it to packages:), or set params.load_in_4bit: false"
)


def _quantization() -> Any:
    try:
        import bitsandbytes  # noqa: F401 - transformers needs it for load_in_4bit
    except ImportError as exc:
        raise MissingDependency(
            f"4-bit base weights need bitsandbytes, which is not installed here ({exc})", install_hint=BITSANDBYTES_HINT
        ) from exc
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


def load_classifier(
    load_from: str, labels: list[str], device: str, four_bit: bool, local_only: bool, problem_type: str | None = None
) -> tuple[Any, Any]:
    """The tokenizer and the decoder with a fresh head over `labels` (its last token's state classifies);
    *problem_type*: transformers' loss when not a softmax (a multiselect's sigmoids: hf_heads.py)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    local = {"local_files_only": True} if local_only else {}
    tokenizer = AutoTokenizer.from_pretrained(load_from, **local)
    if tokenizer.pad_token is None:  # decoders rarely have one; the head reads the last non-pad token
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    extra: dict[str, Any] = {}
    if four_bit:
        extra = {"quantization_config": _quantization(), "device_map": {"": device}}
    model = AutoModelForSequenceClassification.from_pretrained(
        load_from,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        ignore_mismatched_sizes=True,
        **({"problem_type": problem_type} if problem_type else {}),
        **extra,
        **local,
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    if four_bit:
        from peft import prepare_model_for_kbit_training

        return tokenizer, prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    return tokenizer, model.to(device)


def apply_lora(model: Any, lora: dict[str, Any], log: Any) -> tuple[Any, list[str] | str]:
    """The model with LoRA adapters (the head trains whole); and the modules adapted."""
    from peft import LoraConfig, TaskType, get_peft_model

    family = getattr(model.config, "model_type", "")
    targets = lora.get("target_modules") or LORA_TARGETS.get(family)

    def wrapped(chosen: Any) -> Any:
        return get_peft_model(
            model,
            LoraConfig(
                task_type=TaskType.SEQ_CLS,
                r=int(lora["r"]),
                lora_alpha=int(lora["alpha"]),
                lora_dropout=float(lora["dropout"]),
                target_modules=chosen,
            ),
        )

    try:
        peft_model = wrapped(targets)
    except ValueError as exc:
        if lora.get("target_modules"):
            raise ValidationFailed(
                f"params.lora.target_modules {lora['target_modules']} do not name layers of "
                f"this {family or 'model'}: {exc}"
            ) from exc
        log("info", f"no LoRA targets known for a {family or 'model'} ({exc}); adapting every linear layer")
        targets = "all-linear"
        peft_model = wrapped(targets)
    chosen = sorted(peft_model.peft_config["default"].target_modules)
    return peft_model, chosen


def has_bitsandbytes() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


def gpu_room_problem(load_from: str, model_name: str, load_in_4bit: str, device: str, local_only: bool) -> str | None:
    """Why the model does not fit this GPU's free memory (host/llm_fit.py's estimate from its config.json),
    before minutes go into loading it; None when it fits, or when its config says too little to tell."""
    import torch
    from transformers import AutoConfig

    from potato_queue.host.llm_fit import ModelAsk, fit_lines

    try:
        config = AutoConfig.from_pretrained(load_from, local_files_only=local_only).to_dict()
    except (OSError, ValueError):
        return None  # loading the model says why, with its own fix
    gpu = torch.device(device)
    free_bytes, _total = torch.cuda.mem_get_info(gpu)
    fits, lines = fit_lines(
        ModelAsk(model_name, load_in_4bit), config, [(gpu.index or 0, free_bytes / 2**20)], has_bitsandbytes()
    )
    return None if fits else lines[-1]


def count_truncated(tokenizer: Any, texts: list[str], max_length: int) -> int:
    """How many of `texts` are longer than max_length tokens (cut to it in training and prediction)."""
    lengths = tokenizer(texts, truncation=False, add_special_tokens=True)["input_ids"]
    return sum(1 for ids in lengths if len(ids) > max_length)


def load_adapter(model: Any, folder: str) -> None:
    """The adapter (and head) weights peft saved in `folder` put back into `model`, on its device."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = os.path.join(folder, "adapter_model.safetensors")
    set_peft_model_state_dict(model, load_file(weights, device=str(next(model.parameters()).device)))
