"""A tiny decoder LLM built here, offline: what the hf-llm-lora tests train (no model can be downloaded).

A byte-level BPE tokenizer trained with the tokenizers library on the project's own texts, and a
randomly initialised Llama (or Qwen2) of two layers and 32 wide, both saved with save_pretrained: the
trainer loads them through transformers' Auto classes exactly as it would a model from the hub.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["build_tiny_llm"]


def build_tiny_llm(folder: Path, texts: list[str], family: str = "llama", vocab_size: int = 400, **shape: int) -> Path:
    """Train the tokenizer on `texts`, build the model of `family` ("llama" or "qwen2"), save both in `folder`.
    `shape` overrides the model's tiny sizes (bench/gpu_check.py builds a Qwen2.5-0.5B-shaped one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>", padding_side="left"
    ).save_pretrained(folder)
    size = {
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "eos_token_id": tokenizer.token_to_id("<|endoftext|>"),
        **shape,
    }
    model = LlamaForCausalLM(LlamaConfig(**size)) if family == "llama" else Qwen2ForCausalLM(Qwen2Config(**size))
    model.save_pretrained(folder)
    return folder
