"""``hf-llm-lora``: fine-tune a decoder LLM (Llama, Qwen, Mistral, Phi ...) with LoRA for radio schemes and multiselects.

The decoder gets a classification head over the schema's labels (transformers'
``AutoModelForSequenceClassification``: the last token's state is classified;
a multiselect's is one sigmoid a label with thresholds chosen on val, hf_heads.py),
LoRA adapters through peft (per-family targets, llm_parts.LORA_TARGETS), and,
where CUDA is there, 4-bit nf4 base weights with double quantisation and bf16
compute through bitsandbytes (QLoRA). A plain torch loop: AdamW over the
adapters and the head, linear warmup and decay, gradient accumulation,
autocast in bf16/fp16 on a GPU, gradient checkpointing, and a checkpoint every
``checkpoint_every_steps`` (and when preempted) that a requeued or resumed run
continues from.

Params: ``model_name`` (a hub name or a local folder), ``epochs`` (1),
``learning_rate`` (2e-4), ``batch_size`` (4), ``grad_accum_steps`` (4),
``max_length`` (256 tokens; how many items were cut is said in run.log),
``lora`` ({r: 16, alpha: 32, dropout: 0.05, target_modules: per family}),
``load_in_4bit`` (auto: on a CUDA GPU; true refuses a CPU with the fix),
``precision`` (auto, bf16, fp16, fp32), ``gradient_checkpointing`` (true),
``merge`` (false: the adapter is the model file, small to copy back; true:
the adapter merged into full base weights), ``checkpoint_every_steps`` (50),
``seed``, ``weight_decay`` (0), ``warmup_ratio`` (0.03), ``log_every``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from potato_queue.trainers import llm_loop
from potato_queue.trainers.common import seed_everything
from potato_queue.trainers.fine_tune import Progress
from potato_queue.trainers.hf_fit import FineTuneTrainer, FitCard, head_entry
from potato_queue.trainers.hf_heads import Head, head_for
from potato_queue.trainers.hub import check_model
from potato_queue.trainers.llm_settings import LLMSettings, read_settings
from potato_queue.trainers.multilabel import validate_by_kind
from potato_queue.wire.scoring import MULTILABEL
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext

__all__ = ["HFLLMLoRATrainer"]


class HFLLMLoRATrainer(FineTuneTrainer):
    """One LoRA-adapted decoder classifier per radio scheme or multiselect."""

    name: ClassVar[str] = "hf-llm-lora"
    requires: ClassVar[tuple[str, ...]] = ("torch", "transformers", "peft")
    kinds: ClassVar[tuple[str, ...]] = ("nominal", MULTILABEL)
    checkpoint_every_steps: ClassVar[int] = 50

    def __init__(self) -> None:
        self.settings: LLMSettings | None = None
        self._models: dict[str, tuple[Any, Any, Head]] = {}
        self.offline = False

    def validate(self, ctx: RunContext) -> list[str]:
        """Radio schemes and multiselects with train data, sane params, a model that exists, 4-bit only where it
        can run."""
        from potato_queue.trainers.llm_parts import gpu_room_problem, refuse_4bit

        self.settings = settings = read_settings(ctx)
        problems = super().validate(ctx) or validate_by_kind(ctx, min_train=2)
        found, self.offline = check_model(settings, ctx.reporter.log)
        problems += found
        refusal = refuse_4bit(ctx.device) if settings.load_in_4bit == "true" else None
        if refusal:
            problems.append(refusal)
        if not problems and ctx.device.startswith("cuda"):
            room = gpu_room_problem(
                settings.load_from, settings.model_name, settings.load_in_4bit, ctx.device, self.offline
            )
            problems += [room] if room else []
        return problems

    def fit_on_rank(self, ctx: RunContext) -> FitResult:
        settings = self.settings or read_settings(ctx)
        seed_everything(settings.seed)
        heads = {s.name: head_for(ctx, s) for s in ctx.schemas}
        data = {s.name: heads[s.name].read(ctx.bundle, "train", s.name) for s in ctx.schemas}
        # Steps are optimiser updates: grad_accum_steps batches each, the last of an epoch maybe fewer.
        sizes = {name: len(texts) for name, (texts, _) in data.items()}
        progress = Progress.for_fit(ctx, sizes, settings, settings.grad_accum_steps)
        card = FitCard(self.name, ctx, settings)
        start = ctx.resume_point()
        for schema in ctx.schemas:
            texts, gold = data[schema.name]
            loop = llm_loop.SchemaLoop(ctx, settings, schema, heads[schema.name], progress, self.offline)
            metrics = loop.run(texts, gold, start)
            self._models[schema.name] = (loop.tokenizer, loop.model, loop.head)
            card.add(
                schema,
                metrics,
                {
                    **head_entry(schema, loop.head, len(texts)),
                    "lora_targets": loop.targets,
                    "precision": loop.precision.name,
                    "load_in_4bit": loop.four_bit,
                    "truncated": loop.truncated,
                },
            )
        lora = settings.lora
        notes = [
            f"base model: {settings.model_name}",
            f"LoRA r={lora['r']} alpha={lora['alpha']} on {', '.join(card.schemas[ctx.schemas[0].name]['lora_targets'])}"
            + ("; merged into the saved model" if settings.merge else "; the adapter is the saved model"),
        ]
        return card.result(self._models[ctx.schemas[0].name][2].outputs, notes, progress.done)

    def predict(self, ctx: RunContext, items: Iterable[PredictItem]) -> Iterator[Prediction]:
        """Each scheme's prediction as its head reads the outputs: the top label and its probability, or a
        multiselect's labels over their thresholds."""
        from potato_queue.trainers.llm_parts import precision_for

        settings = self.settings or read_settings(ctx)
        precision = precision_for(settings.precision, ctx.device)
        items = list(items)
        for schema in ctx.schemas:
            tokenizer, model, head = self._models[schema.name]
            for chunk, rows in llm_loop.probabilities(
                ctx, settings, precision, tokenizer, model, [i.text for i in items], head
            ):
                for item, row in zip([items[i] for i in chunk], rows):  # noqa: B905 - runs on 3.8/3.9
                    yield head.prediction(item.instance_id, schema.name, row)
