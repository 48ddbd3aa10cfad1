"""What every transformers trainer's fit does around its own training loop, in one place.

hf-text-, hf-image- and hf-token-classification, and hf-llm-lora (which plans its steps its own way):
the modules a run needs (peft with LoRA), the model card and the :class:`FitResult` a fit ends in, a
scheme's saved model (rank 0 alone writes) and how it is loaded again, and the :class:`SchemeFit` a
scheme's train and evaluate steps share; for the trainers read through a head (hf-text- and
hf-image-classification, :class:`HeadFineTuneTrainer`) also the head's forward passes, its tuning and
predict. The loops themselves, and how each trainer reads its data and feeds it to its model, stay with it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Generic, TypeVar

from potato_queue.trainers import parallel
from potato_queue.trainers.common import CARD_FILE, model_version, slug, write_json
from potato_queue.trainers.fine_tune import FineTune, Progress, one_stream
from potato_queue.trainers.hf_heads import Head
from potato_queue.trainers.hf_text_parts import LORA_OFF, HFSettings
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext, Trainer
from potato_queue.worker.spec import SchemaSpec

__all__ = [
    "with_peft",
    "FineTuneTrainer",
    "FitCard",
    "SchemeFit",
    "HeadFineTuneTrainer",
    "head_entry",
    "in_chunks",
    "load_saved",
    "save_schema",
]

T = TypeVar("T")
H = TypeVar("H")


def with_peft(requires: Sequence[str], params: dict[str, Any]) -> list[str]:
    """A trainer's required modules, and peft when the params turn LoRA on."""
    return list(requires) + (["peft"] if params.get("lora") not in LORA_OFF else [])


class FineTuneTrainer(Trainer):
    """A transformers fine-tune (hf-text-, hf-token-, hf-image-classification, hf-llm-lora): torch, peft when
    LoRA is on, and a fit every data-parallel rank runs (trainers/parallel.py joins them around fit_on_rank)."""

    uses_torch: ClassVar[bool] = True
    data_parallel: ClassVar[bool] = True

    def required_modules(self, params: dict[str, Any]) -> list[str]:
        """The trainer's modules, plus peft when LoRA is on."""
        return with_peft(self.requires, params)

    def fit(self, ctx: RunContext) -> FitResult:
        with parallel.data_parallel(ctx):
            return self.fit_on_rank(ctx)

    def fit_on_rank(self, ctx: RunContext) -> FitResult:
        """This rank's fit (every rank's, in a data-parallel run): the trainer's own."""
        raise NotImplementedError


def head_entry(schema: SchemaSpec, head: Head, n_train: int) -> dict[str, Any]:
    """What the model card says of a scheme trained through a head (hf_heads.py), beside its folder."""
    return {"kind": schema.kind or "nominal", "label_order": head.outputs, "n_train": n_train, **head.card()}


class FitCard:
    """One fit's metrics and model card, gathered as its schemes finish, and the FitResult they end in."""

    def __init__(self, trainer: str, ctx: RunContext, settings: Any) -> None:
        self.trainer, self.ctx, self.settings = trainer, ctx, settings
        self.metrics: dict[str, float] = {}
        self.schemas: dict[str, dict[str, Any]] = {}  # each scheme's card entry, in the spec's order

    def add(self, schema: SchemaSpec, metrics: dict[str, float], entry: dict[str, Any]) -> None:
        """A finished scheme: its metrics, and its card *entry* after the folder its model is saved in."""
        self.metrics.update(metrics)
        self.schemas[schema.name] = {"folder": slug(schema.name), **entry}

    def result(self, label_order: list[str], notes: list[str], steps: int) -> FitResult:
        """Write ``model_card.json`` (rank 0) and say what the fit made. The settings are read now, as the
        fit ended: what it adjusted to the model (a lowered max_length) is what the card shows."""
        ctx = self.ctx
        if ctx.main_rank:
            card = {
                "trainer": self.trainer,
                "settings": asdict(self.settings),
                "device": ctx.device,
                "schemas": self.schemas,
            }
            write_json(os.path.join(ctx.workdir, CARD_FILE), card)
        return FitResult(
            model_version=model_version(self.trainer, ctx.spec.run_id),
            artifact_paths=[CARD_FILE] + [slug(s.name) for s in ctx.schemas],
            metrics=self.metrics,
            label_order=label_order,
            notes=notes,
            steps=steps,
        )


def save_schema(ctx: RunContext, schema: SchemaSpec, model: Any, preprocessor: Any, head: Head | None = None) -> None:
    """A scheme's model, its tokenizer or image processor and its head's files into ``<workdir>/<schema>/``;
    rank 0 alone writes (every rank holds the same weights)."""
    if ctx.main_rank:
        folder = os.path.join(ctx.workdir, slug(schema.name))
        model.save_pretrained(folder)
        preprocessor.save_pretrained(folder)
        if head is not None:
            head.save(folder)


def load_saved(ctx: RunContext, schema: SchemaSpec, preprocessor_class: Any, model_class: Any) -> tuple[str, Any, Any]:
    """What :func:`save_schema` wrote of *schema*: its folder, its preprocessor and its model (on the run's device),
    never looked up on the hub."""
    folder = os.path.join(ctx.workdir, slug(schema.name))
    preprocessor = preprocessor_class.from_pretrained(folder, local_files_only=True)
    model = model_class.from_pretrained(folder, local_files_only=True).to(ctx.device)
    return folder, preprocessor, model


def in_chunks(items: list[T], size: int) -> Iterator[list[T]]:
    """*items* in order, *size* at a time (the last chunk may be shorter)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(frozen=True)
class SchemeFit(Generic[H]):
    """One scheme's model as it trains, and what its train and evaluate steps read it with."""

    ctx: RunContext
    schema: SchemaSpec
    model: Any
    preprocessor: Any  # its tokenizer or image processor
    head: H  # its head (hf_heads.py), or a tagger's tag names

    def tune(
        self,
        settings: HFSettings,
        progress: Progress,
        items: list[T],
        loss: Callable[[Any, list[T]], Any],
        evaluate: Callable[[int], None],
    ) -> float:
        """The epochs over *items* (fine_tune.py), in one order stream from the seed; the last epoch's mean loss."""
        loop: FineTune[T] = FineTune(self.ctx, self.schema, self.model, settings, progress, one_stream(settings.seed))
        return loop.run(items, loss, evaluate)


class HeadFineTuneTrainer(FineTuneTrainer):
    """A fine-tune whose schemes are read through a head (hf_heads.py): hf-text- and hf-image-classification.
    It keeps each trained scheme for predict and runs the forward passes of tuning and predict; the trainer
    says where its settings and a scheme's saved model come from and how a chunk of its inputs is fed."""

    def __init__(self) -> None:
        self.settings: HFSettings | None = None
        #: ``{schema: (tokenizer or image processor, model, head)}`` kept after fit for predict.
        self._models: dict[str, tuple[Any, Any, Head]] = {}
        # Nothing is asked of the hub: the model is a local folder, or the hub does not answer.
        self.offline = False

    def _settings(self, ctx: RunContext) -> HFSettings:
        """The run's settings: those validate read, else read now with the trainer's defaults."""
        raise NotImplementedError

    def _model_for(self, ctx: RunContext, schema: SchemaSpec) -> tuple[Any, Any, Head]:
        """The fitted (preprocessor, model, head) of *schema*: in memory after fit, else from the workdir."""
        raise NotImplementedError

    def _inputs(self, ctx: RunContext, preprocessor: Any, chunk: list[Any]) -> dict[str, Any]:
        """A chunk of the trainer's inputs (texts, bundle rows) as the model's keyword arguments."""
        raise NotImplementedError

    def _outputs(self, ctx: RunContext, schema: SchemaSpec, inputs: list[Any]) -> list[list[float]]:
        """Each input's outputs as the scheme's head reads them (probabilities, or a slider's number); twice a
        batch a forward pass, as no gradients are kept."""
        import torch

        settings = self._settings(ctx)
        preprocessor, model, head = self._model_for(ctx, schema)
        model.eval()
        rows: list[list[float]] = []
        for chunk in in_chunks(inputs, settings.batch_size * 2):
            with torch.no_grad():
                logits = model(**self._inputs(ctx, preprocessor, chunk)).logits.float()
            rows += head.activate(logits)
        return rows

    def _keep(self, fit: SchemeFit[Head], val_inputs: list[Any], val_answers: list[Any]) -> None:
        """A trained scheme, its LoRA adapters merged in, kept for predict, its head tuned on val (a multiselect's
        thresholds: from the merged model, the one predict runs) and saved."""
        ctx, schema, head = fit.ctx, fit.schema, fit.head
        model = fit.model.merge_and_unload() if self._settings(ctx).lora else fit.model
        self._models[schema.name] = (fit.preprocessor, model, head)
        if head.tunes:
            head.tune(self._outputs(ctx, schema, val_inputs), val_answers)
        save_schema(ctx, schema, model, fit.preprocessor, head)

    def _predictions(
        self, ctx: RunContext, items: list[PredictItem], input_of: Callable[[PredictItem], Any]
    ) -> Iterator[Prediction]:
        """Each scheme's prediction of each item as its head reads the outputs for *input_of* the item, twice a
        batch at a time: a generator, so predictions stream out as each chunk is done."""
        size = self._settings(ctx).batch_size * 2
        for schema in ctx.schemas:
            _, _, head = self._model_for(ctx, schema)
            for chunk in in_chunks(items, size):
                rows = self._outputs(ctx, schema, [input_of(item) for item in chunk])
                for item, row in zip(chunk, rows):  # noqa: B905 - runs on 3.8/3.9
                    yield head.prediction(item.instance_id, schema.name, row)
