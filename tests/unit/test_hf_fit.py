"""What the transformers trainers share around their loops (trainers/hf_fit.py, hub.py, hf_text_parts.py,
parallel.py), in process on stand-ins: the card and the result, the saved folder and its loading again,
predict's chunks, peft with LoRA, the model check and the not-cached error, the step count, and max_length
lowered to what a model takes.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from potato_queue.trainers import parallel
from potato_queue.trainers.common import CARD_FILE
from potato_queue.trainers.fine_tune import Progress
from potato_queue.trainers.hf_fit import (
    FitCard,
    HeadFineTuneTrainer,
    head_entry,
    in_chunks,
    load_saved,
    save_schema,
    with_peft,
)
from potato_queue.trainers.hf_heads import Head
from potato_queue.trainers.hf_text_parts import HFSettings, fit_max_length, position_limit
from potato_queue.trainers.hub import check_model, explain_not_cached
from potato_queue.worker.api import PredictItem
from potato_queue.worker.errors import TrainerError

pytestmark = pytest.mark.unit


class Said:
    """A reporter's log lines."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def log(self, level: str, msg: str) -> None:
        self.lines.append((level, msg))


def settings(**changed: Any) -> HFSettings:
    fields: dict[str, Any] = {
        "model_name": "org/model",
        "epochs": 2,
        "learning_rate": 5e-5,
        "batch_size": 4,
        "max_length": 256,
        "lora": None,
        "seed": 0,
        "weight_decay": 0.01,
        "warmup_ratio": 0.06,
        "log_every": 0,
    }
    return HFSettings(**{**fields, **changed})


def context(tmp_path: Path, main_rank: bool = True) -> Any:
    schemas = [SimpleNamespace(name="sentiment", kind=None), SimpleNamespace(name="my topics", kind="multilabel")]
    return SimpleNamespace(
        main_rank=main_rank,
        workdir=str(tmp_path),
        device="cpu",
        rank=None,
        schemas=schemas,
        spec=SimpleNamespace(run_id="20250101T000000-abc123"),
        reporter=Said(),
    )


def test_the_card_and_the_result_of_a_fit(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    run = settings()
    card = FitCard("hf-text-classification", ctx, run)
    card.add(ctx.schemas[0], {"sentiment_train_loss": 0.5}, head_entry(ctx.schemas[0], Head(["neg", "pos"]), 10))
    card.add(ctx.schemas[1], {"topics_train_loss": 0.25}, {"kind": "multilabel", "n_train": 3})
    run.max_length = 64  # lowered during the fit: the card shows what was trained with
    result = card.result(["neg", "pos"], ["base model: org/model"], 12)
    assert result.model_version == "hf-text-classification-20250101T000000-abc123"
    assert result.artifact_paths == [CARD_FILE, "sentiment", "my_topics"]
    assert result.metrics == {"sentiment_train_loss": 0.5, "topics_train_loss": 0.25}
    assert (result.label_order, result.notes, result.steps) == (["neg", "pos"], ["base model: org/model"], 12)
    written = json.loads((tmp_path / CARD_FILE).read_text())
    assert list(written) == ["trainer", "settings", "device", "schemas"]
    assert written["settings"]["max_length"] == 64 and written["device"] == "cpu"
    assert written["schemas"] == {
        "sentiment": {"folder": "sentiment", "kind": "nominal", "label_order": ["neg", "pos"], "n_train": 10},
        "my topics": {"folder": "my_topics", "kind": "multilabel", "n_train": 3},
    }


def test_only_rank_0_writes_the_card_and_the_models(tmp_path: Path) -> None:
    saved: list[str] = []
    model = SimpleNamespace(save_pretrained=lambda folder: saved.append(folder))
    for main_rank in (False, True):
        ctx = context(tmp_path, main_rank=main_rank)
        FitCard("t", ctx, settings()).result([], [], 0)
        save_schema(ctx, ctx.schemas[1], model, model)
        assert (tmp_path / CARD_FILE).exists() is main_rank
    assert saved == [str(tmp_path / "my_topics")] * 2  # the model, then its tokenizer


def test_a_saved_scheme_loads_from_its_folder_onto_the_device_never_from_the_hub(tmp_path: Path) -> None:
    asked: list[tuple[str, str, dict[str, Any]]] = []

    class Loads:
        def __init__(self, what: str) -> None:
            self.what = what

        def from_pretrained(self, folder: str, **options: Any) -> Any:
            asked.append((self.what, folder, options))
            return SimpleNamespace(to=lambda device: f"{self.what} on {device}")

    ctx = context(tmp_path)
    folder, _, model = load_saved(ctx, ctx.schemas[1], Loads("tokenizer"), Loads("m"))
    assert folder == str(tmp_path / "my_topics") and model == "m on cpu"
    assert asked == [(what, folder, {"local_files_only": True}) for what in ("tokenizer", "m")]


def test_items_come_in_chunks_and_each_schemes_predictions_a_chunk_at_a_time(tmp_path: Path) -> None:
    assert list(in_chunks(list(range(5)), 2)) == [[0, 1], [2, 3], [4]] and list(in_chunks([], 3)) == []
    fed: list[list[str]] = []

    class Stand(HeadFineTuneTrainer):
        def _settings(self, ctx: Any) -> HFSettings:
            return settings(batch_size=1)  # two items a forward pass

        def _model_for(self, ctx: Any, schema: Any) -> tuple[Any, Any, Head]:
            return None, None, Head(["neg", "pos"])

        def _outputs(self, ctx: Any, schema: Any, inputs: list[Any]) -> list[list[float]]:
            fed.append(inputs)
            return [[0.9, 0.1] if text == "bad" else [0.2, 0.8] for text in inputs]

    items = [PredictItem(f"i{n}", text, "unlabelled", {}) for n, text in enumerate(["bad", "good", "bad"])]
    predictions = Stand()._predictions(context(tmp_path), items, lambda item: item.text)
    said = [(p.instance_id, p.schema_name, p.label) for p in predictions]
    assert fed == [["bad", "good"], ["bad"]] * 2
    assert said[:3] == [("i0", "sentiment", "neg"), ("i1", "sentiment", "pos"), ("i2", "sentiment", "neg")]
    assert [schema for _, schema, _ in said[3:]] == ["my topics"] * 3


@pytest.mark.parametrize(
    ("lora", "peft"), [(None, False), (False, False), ("false", False), (0, False), (True, True), ({"r": 4}, True)]
)
def test_peft_is_required_with_lora_on(lora: Any, peft: bool) -> None:
    assert with_peft(("torch", "transformers"), {"lora": lora}) == ["torch", "transformers"] + (
        ["peft"] if peft else []
    )


def test_a_model_path_that_is_no_folder_is_a_problem_and_a_local_one_loads_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")  # no probe of the hub; check_model sets them again, restored after
    said = Said()
    problems, offline = check_model(settings(model_name=str(tmp_path / "missing")), said.log)
    assert problems == [f"params.model_name {tmp_path / 'missing'} is not a folder on this machine"] and offline
    assert check_model(settings(model_name=str(tmp_path)), said.log) == ([], True)
    assert len(said.lines) == 1 and "must be in this machine's Hugging Face cache" in said.lines[0][1]


def test_a_hub_model_missing_offline_says_how_to_bring_it_and_other_errors_go_on(tmp_path: Path) -> None:
    with pytest.raises(TrainerError, match="not in this machine's Hugging Face cache") as caught:
        with explain_not_cached(settings(), offline=True):
            raise OSError("no file")
    assert isinstance(caught.value.__cause__, OSError)
    for choice, offline in ((settings(), False), (settings(model_name=str(tmp_path)), True)):
        with pytest.raises(OSError, match="no file"), explain_not_cached(choice, offline):
            raise OSError("no file")


def test_the_steps_of_a_fit_are_every_epochs_batches_of_every_scheme(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    assert parallel.batches(9, 4, ctx) == 3 and parallel.batches(8, 4, ctx) == 2
    assert Progress.for_fit(ctx, {"a": 9, "b": 8}, settings(epochs=3, batch_size=4)).total == 15


@pytest.mark.parametrize(
    ("positions", "tokenizer_says", "limit"),
    [
        (512, 10**30, 512),  # a tokenizer never told its model's length
        (514, 512, 512),  # RoBERTa: two rows of its table are not positions
        (None, 4096, 4096),
        (None, None, None),
    ],
)
def test_the_most_tokens_a_model_takes(positions: int | None, tokenizer_says: int | None, limit: int | None) -> None:
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=positions))
    assert position_limit(SimpleNamespace(model_max_length=tokenizer_says), model) == limit


def test_a_model_with_relative_positions_only_has_no_limit_from_its_table() -> None:
    """DeBERTa-v3 says max_position_embeddings 512 but adds no absolute positions: 1024 tokens work there."""
    deberta = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512, position_biased_input=False))
    assert position_limit(SimpleNamespace(model_max_length=int(1e30)), deberta) is None
    biased = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512, position_biased_input=True))
    assert position_limit(SimpleNamespace(model_max_length=int(1e30)), biased) == 512


def test_a_max_length_past_the_models_positions_is_lowered_saying_so(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    tokenizer, model = SimpleNamespace(), SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512))
    run = settings(max_length=1024)
    fit_max_length(ctx, run, tokenizer, model)
    assert run.max_length == 512
    assert ctx.reporter.lines == [
        ("warning", "params.max_length 1024 is more than org/model takes: lowered to its 512 tokens")
    ]
    fit_max_length(ctx, run, tokenizer, model)  # within the limit: nothing to say
    assert len(ctx.reporter.lines) == 1
