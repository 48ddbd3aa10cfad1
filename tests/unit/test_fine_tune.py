"""The one fine-tune loop (trainers/fine_tune.py), in process on a tiny torch model: the orders it takes, the
progress it reports, its stops, and a resumed run that ends where a run never stopped ends, stopped anywhere."""

from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from potato_queue.trainers.fine_tune import (
    POSITION_FILE,
    FineTune,
    Order,
    Progress,
    Resumable,
    one_stream,
    optimizer_for,
    seeded_by_epoch,
)
from potato_queue.wire.checkpoint import Checkpoints
from potato_queue.wire.events import Reporter
from potato_queue.worker.api import RunContext
from potato_queue.worker.errors import Cancelled, Preempted

pytestmark = pytest.mark.unit

torch = pytest.importorskip("torch")

N_ITEMS, BATCH, ACCUMULATE, EPOCHS = 11, 2, 2, 3  # 6 batches an epoch, 3 updates of 2 (the last of 2 too)
UPDATES = EPOCHS * 3


def recipe(**changed: Any) -> Any:
    fields = {"epochs": EPOCHS, "batch_size": BATCH, "learning_rate": 0.05, "weight_decay": 0.01}
    return SimpleNamespace(**{**fields, "warmup_ratio": 0.2, "log_every": 0, **changed})


class Run:
    """A RunContext on an in-memory event stream, whose stop flag the test raises (a preemption or a cancel)."""

    def __init__(self, tmp_path: Path, preempted: bool = True) -> None:
        self.stop = False
        self.stream = io.StringIO()
        spec = SimpleNamespace(workdir=str(tmp_path / "work"), params={}, schemas=[SimpleNamespace(name="s")])
        self.ctx = RunContext(
            spec,  # type: ignore[arg-type]
            SimpleNamespace(),  # type: ignore[arg-type]
            Reporter(self.stream, should_stop=lambda: self.stop, min_progress_interval_s=0),
            "cpu",
            Checkpoints(str(tmp_path / "checkpoints")),
            lambda: preempted,
        )

    def events(self, kind: str) -> list[dict[str, Any]]:
        found = [json.loads(line) for line in self.stream.getvalue().splitlines()]
        return [e for e in found if e["event"] == kind]


class StopAt(Progress):
    """The run's counter, raising the stop flag once `at` updates are done."""

    run: Run
    at: int = 0

    def advance(self, ctx: Any, schema: Any, loss: float) -> None:
        super().advance(ctx, schema, loss)
        if self.done == self.at:
            self.run.stop = True


def items() -> list[tuple[list[float], int]]:
    rng = random.Random(3)
    return [([rng.uniform(-1, 1) for _ in range(4)], i % 2) for i in range(N_ITEMS)]


def model() -> Any:
    torch.manual_seed(0)  # dropout: a resumed run must draw the masks a run never stopped draws
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 2))


def train(run: Run, net: Any, order: Order, seen: list[list[int]], at: int = 0, start: str | None = None) -> None:
    """One resumable loop over items(), from the checkpoint `start`; the batches it takes (item indexes) into
    `seen`. Stopped after update `at` (0: never)."""
    data = items()

    def loss(forward: Any, chunk: list[tuple[list[float], int]]) -> Any:
        seen.append([data.index(item) for item in chunk])
        out = forward(torch.tensor([x for x, _ in chunk]))
        return torch.nn.functional.cross_entropy(out, torch.tensor([y for _, y in chunk]))

    def save(folder: str) -> None:
        os.makedirs(folder)
        torch.save(net.state_dict(), os.path.join(folder, "weights.pt"))

    def load(folder: str) -> None:
        net.load_state_dict(torch.load(os.path.join(folder, "weights.pt"), weights_only=True))

    progress = StopAt({"s": UPDATES})
    progress.run, progress.at = run, at
    loop: FineTune[tuple[list[float], int]] = FineTune(
        run.ctx,
        SimpleNamespace(name="s"),
        net,
        recipe(),
        progress,
        order,
        ACCUMULATE,
        resumable=Resumable(save, load, start),
    )
    loop.run(data, loss, lambda step: None)


def test_the_hf_trainers_order_is_one_generator_drawn_each_epoch_in_turn_asked_for_any_epoch() -> None:
    generator = torch.Generator().manual_seed(7)
    drawn = [torch.randperm(13, generator=generator).tolist() for _ in range(4)]
    assert [one_stream(7)(13, epoch) for epoch in (0, 1, 2, 3)] == drawn
    assert one_stream(7)(13, 2) == drawn[2], "an epoch asked alone is the same draw"
    assert seeded_by_epoch(7)(13, 2) == torch.randperm(13, generator=torch.Generator().manual_seed(9)).tolist()


def test_warmup_then_linear_decay() -> None:
    optimizer, scheduler = optimizer_for(torch.nn.Linear(2, 1), recipe(learning_rate=1.0, warmup_ratio=0.2), 10)
    rates = []
    for _ in range(10):
        rates.append(round(optimizer.param_groups[0]["lr"], 6))
        optimizer.step()
        scheduler.step()
    assert rates == [0.333333, 0.666667, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]


def test_progress_counts_every_schemas_updates_and_says_the_loss_every_log_every(tmp_path: Path) -> None:
    run = Run(tmp_path)
    progress = Progress.for_fit(run.ctx, {"a": 9, "b": 8}, recipe(epochs=2, batch_size=2, log_every=2), accumulate=2)
    assert (progress.per_schema, progress.offsets, progress.total) == ({"a": 6, "b": 4}, {"a": 0, "b": 6}, 10)
    progress.resume_at(6)
    for _ in range(4):
        progress.advance(run.ctx, SimpleNamespace(name="b"), 0.5)
    assert [e["step"] for e in run.events("metric")] == [8, 10]
    assert [(e["current"], e["total"]) for e in run.events("progress")] == [(7, 10), (8, 10), (9, 10), (10, 10)]


def test_a_cancel_stops_a_loop_that_does_not_checkpoint_at_its_next_batch(tmp_path: Path) -> None:
    run = Run(tmp_path, preempted=False)
    net, data = model(), items()

    def loss(forward: Any, chunk: list[tuple[list[float], int]]) -> Any:
        run.stop = True
        return forward(torch.tensor([x for x, _ in chunk])).sum()

    loop: FineTune[tuple[list[float], int]] = FineTune(
        run.ctx, SimpleNamespace(name="s"), net, recipe(), Progress({"s": 18}), one_stream(0)
    )
    with pytest.raises(Cancelled, match="^Cancelled during training$"):
        loop.run(data, loss, lambda step: None)
    assert [e["current"] for e in run.events("progress")] == [1], "the batch it began is finished, no other"
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("order", [one_stream(5), seeded_by_epoch(5)], ids=["one stream", "seed + epoch"])
@pytest.mark.parametrize("at", range(1, UPDATES))
def test_a_run_preempted_after_any_update_resumes_to_the_weights_of_a_run_never_stopped(
    tmp_path: Path, order: Order, at: int
) -> None:
    whole, net, every = Run(tmp_path / "whole"), model(), []
    train(whole, net, order, every)
    expected = {name: value.clone() for name, value in net.state_dict().items()}

    cut, before = Run(tmp_path / "cut"), []
    with pytest.raises(Preempted, match=f"^Preempted at step {at}$"):
        train(cut, model(), order, before, at=at)
    saved = cut.ctx.checkpoints.latest()
    assert saved is not None and saved.step == at
    epoch, update = divmod(at, 3)
    assert json.loads(Path(saved.path, POSITION_FILE).read_text()) == {
        "schema": "s",
        "step": at,
        "epoch": epoch,
        "update": update,
    }, "an epoch's last update: the next epoch, none of it done"

    random.seed(99)
    torch.manual_seed(99)  # the checkpoint's RNGs are put back
    resumed, net, after = Run(tmp_path / "cut"), model(), []
    train(resumed, net, order, after, start=saved.path)
    assert len(before) == at * ACCUMULATE and before + after == every, "none done twice or left out, in order"
    assert all(torch.equal(value, expected[name]) for name, value in net.state_dict().items())
    assert [e["current"] for e in resumed.events("progress")] == list(range(at + 1, UPDATES + 1))
