"""``hf-image-classification``: fine-tune a transformers image classifier on a project whose items are images.

The items' images are the bundle's ``media/`` (each row's ``media``; a URL is fetched from the training
machine); ``AutoImageProcessor`` and ``AutoModelForImageClassification`` (ViT, ConvNeXt, BEiT, Swin, ...),
one model per radio scheme (softmax) or multiselect (one sigmoid a label, thresholds on val: hf_heads.py),
the same torch loop as hf-text-classification (fine_tune.py: AdamW, warmup/decay, clipping; LoRA through peft with the
head trained in full; data-parallel over several GPUs). Params: ``model_name`` (default
``google/vit-base-patch16-224-in21k``; a local folder is never looked up on the hub), ``epochs`` (3),
``learning_rate`` (5e-5, or 2e-4 with LoRA), ``batch_size`` (16), ``lora``, ``seed``, ``weight_decay``,
``warmup_ratio``, ``log_every``. Each scheme's model and image processor are saved into
``<workdir>/<schema>/``.

An image this machine cannot read (a missing file, a URL it cannot reach, a file that is not an image)
is left out of training and gets no prediction, and run.log names the item and why: a run never fails
for a few bad files. It fails, saying so, when no train image of a scheme can be read.
"""

from __future__ import annotations

import http.client
import io
import urllib.request
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from potato_queue.trainers.common import nominal_target, seed_everything
from potato_queue.trainers.fine_tune import Progress
from potato_queue.trainers.hf_fit import FitCard, HeadFineTuneTrainer, SchemeFit, head_entry, load_saved
from potato_queue.trainers.hf_heads import Head, head_for, saved_head
from potato_queue.trainers.hf_text_parts import HFSettings, apply_lora, read_settings
from potato_queue.trainers.hub import check_model, explain_not_cached
from potato_queue.trainers.multilabel import chosen_labels, validate_by_kind
from potato_queue.trainers.registry import TRAINERS
from potato_queue.wire.scoring import MULTILABEL, score
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext
from potato_queue.worker.bundle import Bundle
from potato_queue.worker.errors import TrainerError
from potato_queue.worker.spec import SchemaSpec

__all__ = ["HFImageClassificationTrainer", "read_image"]

INFO = TRAINERS["hf-image-classification"]  # its params' defaults
FETCH_TIMEOUT_S = 20.0
NAMED_IN_LOG = 50  # unreadable images named one by one in run.log, the rest counted
# 40 megapixels (a 7,300 x 5,500 photo) decode to 120 MB of RGB; past it a file is a decompression bomb (a few KB
# that decode to gigabytes) or a scan no classifier needs whole, and is refused from its header. PIL's own
# check only warns below 178 megapixels.
MAX_IMAGE_PIXELS = 40_000_000
MAX_IMAGE_BYTES = 64 << 20  # of an image read by URL


def read_image(bundle: Bundle, row: dict[str, Any]) -> tuple[Any, str | None]:
    """A row's image as an RGB PIL image, or None and why this machine cannot read it: a missing file, a file
    that is no image or is cut short, a URL that does not answer, or one past MAX_IMAGE_PIXELS (refused from
    its header, before any decoding) or MAX_IMAGE_BYTES."""
    from PIL import Image, UnidentifiedImageError

    reference = row.get("media")
    if not reference:
        missing = str(row.get("media_missing") or "")
        if missing.startswith(("http://", "https://")):  # the server fetches an image run's addresses
            return None, f"its image {missing} could not be fetched when the bundle was built"
        return None, f"its file {missing} was missing when the bundle was built" if missing else "it names no image"
    where = bundle.resolve_media(str(reference))
    try:
        data = _fetched(where) if where.startswith(("http://", "https://")) else where
        with warnings.catch_warnings():
            # PIL warns from 89 megapixels; ours is the stricter bound, checked just below.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(data)
        with opened as image:
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                return None, (
                    f"{where} is {width}x{height} pixels, over the {MAX_IMAGE_PIXELS:,} an image may have here "
                    "(a decompression bomb, or a picture far larger than a classifier needs: downscale it)"
                )
            return image.convert("RGB"), None
    except (
        OSError,
        UnidentifiedImageError,
        ValueError,
        Image.DecompressionBombError,
        http.client.HTTPException,
    ) as exc:
        return None, f"{where} cannot be read here ({type(exc).__name__}: {exc})"


def _fetched(url: str) -> io.BytesIO:
    """An image by URL, at most MAX_IMAGE_BYTES of it (ValueError past that)."""
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as reply:  # noqa: S310 - http(s) only
        data = reply.read(MAX_IMAGE_BYTES + 1)
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"it is over {MAX_IMAGE_BYTES >> 20} MiB, the most an image may be here")
    return io.BytesIO(data)


class HFImageClassificationTrainer(HeadFineTuneTrainer):
    """Fine-tunes one transformers image classifier per radio scheme or multiselect over image items."""

    name: ClassVar[str] = "hf-image-classification"
    requires: ClassVar[tuple[str, ...]] = ("torch", "transformers", "PIL")
    kinds: ClassVar[tuple[str, ...]] = ("nominal", MULTILABEL)
    modalities: ClassVar[tuple[str, ...]] = ("image",)

    def validate(self, ctx: RunContext) -> list[str]:
        """Image items, radio or multiselect schemes with two labels and train items, a model that exists."""
        self.settings = read_settings(ctx, INFO)
        problems = super().validate(ctx) or validate_by_kind(ctx, min_train=2)
        found, self.offline = check_model(self.settings, ctx.reporter.log)
        return problems + found

    def fit_on_rank(self, ctx: RunContext) -> FitResult:
        settings = self._settings(ctx)
        seed_everything(settings.seed)
        heads = {s.name: head_for(ctx, s) for s in ctx.schemas}
        data = {s.name: self._readable(ctx, s, "train", heads[s.name]) for s in ctx.schemas}
        progress = Progress.for_fit(ctx, {name: len(rows) for name, rows in data.items()}, settings)
        card = FitCard(self.name, ctx, settings)
        for schema in ctx.schemas:
            head, train = heads[schema.name], data[schema.name]
            metrics = self._fit_schema(ctx, schema, head, train, progress)
            card.add(schema, metrics, head_entry(schema, head, len(train)))
        return card.result(heads[ctx.schemas[0].name].outputs, [f"base model: {settings.model_name}"], progress.done)

    def _readable(self, ctx: RunContext, schema: SchemaSpec, split: str, head: Head) -> list[tuple[Any, Any, Any]]:
        """(row, target, answer) of *split*'s answered rows whose image this machine reads (decoded then, and again
        a batch at a time: a corpus is not held in memory); the others named in run.log."""
        out, unreadable = [], []
        for row in ctx.bundle.read_split(split):
            answer = chosen_labels(row, schema.name) if schema.kind == MULTILABEL else nominal_target(row, schema.name)
            target = head.target(answer) if answer else None
            if target is None:
                continue
            image, why = read_image(ctx.bundle, row)
            if image is None:
                unreadable.append(f"{row['instance_id']} ({why})")
            else:
                out.append((row, target, answer))
        _say_unreadable(
            ctx,
            f"{split} item(s) of {schema.name}",
            unreadable,
            "left out of training" if split == "train" else "given no prediction (held-out scores count them wrong)",
        )
        if split == "train" and not out:
            raise TrainerError(
                f"No train image of {schema.name} could be read on this machine; run.log names each "
                f"item and why (check that the bundle's media/ came with it, or that its URLs answer)"
            )
        return out

    def _load(self, ctx: RunContext, head: Head) -> tuple[Any, Any]:
        from transformers import AutoImageProcessor, AutoModelForImageClassification

        settings = self._settings(ctx)
        local = {"local_files_only": True} if settings.local_model or self.offline else {}
        with explain_not_cached(settings, self.offline):
            processor = AutoImageProcessor.from_pretrained(settings.load_from, **local)
            model = AutoModelForImageClassification.from_pretrained(
                settings.load_from,
                num_labels=len(head.outputs),
                id2label=dict(enumerate(head.outputs)),
                label2id={label: i for i, label in enumerate(head.outputs)},
                ignore_mismatched_sizes=True,
                **({"problem_type": head.problem_type} if head.problem_type else {}),
                **local,
            )
        return processor, model.to(ctx.device)

    def _fit_schema(
        self, ctx: RunContext, schema: SchemaSpec, head: Head, train: list[tuple[Any, Any, Any]], progress: Progress
    ) -> dict[str, float]:
        settings = self._settings(ctx)
        ctx.reporter.status("running", f"loading {settings.model_name} for {schema.name}")
        processor, model = self._load(ctx, head)
        if settings.lora:
            model = apply_lora(ctx, model, settings.lora, task=None)
        val = self._readable(ctx, schema, "val", head)
        ctx.reporter.status("running", f"training {schema.name} on {len(train)} images")
        fit = SchemeFit(ctx, schema, model, processor, head)
        loss = self._train(fit, train, val, progress)
        self._keep(fit, [row for row, _, _ in val], [answer for _, _, answer in val])
        return {ctx.metric_name(schema, "train_loss"): loss, ctx.metric_name(schema, "n_train"): float(len(train))}

    @staticmethod
    def _pixels(ctx: RunContext, processor: Any, rows: list[dict[str, Any]]) -> Any:
        """The rows' images, decoded now, as the model's input."""
        images = []
        for row in rows:
            image, why = read_image(ctx.bundle, row)
            if image is None:
                raise TrainerError(
                    f"the image of {row['instance_id']} could be read when the run started and no "
                    f"longer can ({why}); keep the bundle's media in place while a run trains"
                )
            images.append(image)
        return processor(images=images, return_tensors="pt")["pixel_values"].to(ctx.device)

    def _train(
        self,
        fit: SchemeFit[Head],
        train: list[tuple[Any, Any, Any]],
        val: list[tuple[Any, Any, Any]],
        progress: Progress,
    ) -> float:
        """The epochs over (row, target, answer) triples (fine_tune.py); returns the last epoch's mean loss."""
        import torch

        ctx = fit.ctx
        settings = self._settings(ctx)

        def loss(forward: Any, chunk: list[tuple[Any, Any, Any]]) -> Any:
            pixels = self._pixels(ctx, fit.preprocessor, [row for row, _, _ in chunk])
            return forward(pixel_values=pixels, labels=torch.tensor([y for _, y, _ in chunk], device=ctx.device)).loss

        return fit.tune(settings, progress, train, loss, lambda step: self._evaluate(fit, val, step))

    def _evaluate(self, fit: SchemeFit[Head], val: list[tuple[Any, Any, Any]], step: int) -> None:
        """The val split's accuracy (a multiselect's: the whole set right at 0.5) as a metric event."""
        if not val:
            return
        ctx, schema, head = fit.ctx, fit.schema, fit.head
        # _outputs reads the scheme's model from _models: the one in training, not a saved one.
        self._models[schema.name] = (fit.preprocessor, fit.model, head)
        rows = self._outputs(ctx, schema, [row for row, _, _ in val])
        predicted = {i: head.prediction("", schema.name, row).label for i, row in enumerate(rows)}
        scores = score({i: answer for i, (_, _, answer) in enumerate(val)}, predicted, head.kind)
        ctx.reporter.metric("val", ctx.metric_name(schema, "accuracy"), float(scores["accuracy"] or 0.0), step)

    def _inputs(self, ctx: RunContext, preprocessor: Any, chunk: list[Any]) -> dict[str, Any]:
        return {"pixel_values": self._pixels(ctx, preprocessor, chunk)}

    def _settings(self, ctx: RunContext) -> HFSettings:
        return self.settings or read_settings(ctx, INFO)

    def _model_for(self, ctx: RunContext, schema: SchemaSpec) -> tuple[Any, Any, Head]:
        if schema.name not in self._models:
            from transformers import AutoImageProcessor, AutoModelForImageClassification

            folder, processor, model = load_saved(ctx, schema, AutoImageProcessor, AutoModelForImageClassification)
            self._models[schema.name] = (processor, model, saved_head(folder, model.config))
        return self._models[schema.name]

    def predict(self, ctx: RunContext, items: Iterable[PredictItem]) -> Iterator[Prediction]:
        """Each readable item's prediction by its scheme's head; an unreadable image gets none (named in run.log)."""
        readable, unreadable = [], []
        for item in items:
            image, why = read_image(ctx.bundle, item.row)
            if image is None:
                unreadable.append(f"{item.instance_id} ({why})")
            else:
                readable.append(item)
        _say_unreadable(ctx, "item(s) to predict", unreadable, "given no prediction")
        yield from self._predictions(ctx, readable, lambda item: item.row)


def _say_unreadable(ctx: RunContext, what: str, unreadable: list[str], fate: str) -> None:
    if unreadable:
        more = len(unreadable) - NAMED_IN_LOG
        ctx.reporter.log(
            "warning",
            f"{len(unreadable)} {what} have an image this machine cannot read, {fate}: "
            + "; ".join(unreadable[:NAMED_IN_LOG])
            + (f"; and {more} more" if more > 0 else ""),
        )
