"""The torch side of a data-parallel run (worker/parallel.py starts the ranks): DDP for the trainers.

A trainer that sets ``data_parallel`` wraps its ``fit`` in :func:`data_parallel`
(the process group, and stops every rank agrees on), trains through
:func:`wrap` (torch DDP: gradients all-reduced in each backward), takes its
:func:`shard` of every epoch's order and counts its batches from :func:`share` (:func:`batches`).
Each rank takes a disjoint slice of the same shuffled order (every
world_size-th item), the same length for all (a rank with one batch more would
wait for the others forever): up to world_size - 1 items an epoch sit out,
different ones each epoch. When the run
is not data-parallel every function here is the identity.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from potato_queue.worker.api import RunContext
from potato_queue.worker.errors import ValidationFailed

__all__ = ["data_parallel", "wrap", "shard", "share", "batches"]

_KEPT: list[Any] = []  # the DDP wrappers, never freed (see data_parallel)


@contextmanager
def data_parallel(ctx: RunContext) -> Iterator[None]:
    """Around a rank's fit: join the others (nccl on GPUs, gloo on CPUs); stops are decided together."""
    if ctx.rank is None:
        yield
        return
    import torch
    import torch.distributed as dist

    if ctx.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(ctx.device))
    dist.init_process_group("nccl" if ctx.device.startswith("cuda") else "gloo", init_method="env://")
    flags_device = ctx.device if ctx.device.startswith("cuda") else "cpu"

    def agree(stop: bool, preempted: bool) -> tuple[bool, bool]:
        # One tiny all-reduce a check: any rank's stop is every rank's, a preemption wins over a cancel.
        flags = torch.tensor([int(stop), int(preempted)], device=flags_device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return bool(flags[0]), bool(flags[1])

    ctx.agree_stop = agree
    try:
        yield
    finally:
        # Rank 0 predicts alone after fit, with no collective. The process group is never torn down: a gloo
        # group's destructor can wait forever on a rank that already left, so a rank ends with os._exit
        # (worker/__main__.py) and the group, and every DDP wrapper holding it (_KEPT), go with the process.
        ctx.agree_stop = None


def wrap(model: Any, ctx: RunContext) -> Any:
    """What the training forward runs through: DDP over `model` on a rank, `model` itself alone. Evaluation
    and saving keep to `model` (no collective there, so rank 0 alone may do them)."""
    if ctx.rank is None:
        return model
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    devices = [int(ctx.device.split(":")[1])] if ctx.device.startswith("cuda:") else None
    # No buffer sync in each forward (a collective rank 0's evaluation alone would wait on): these models'
    # buffers (rotary tables, position ids) never change. torch 2.13 renamed the switch.
    no_sync = (
        "forward_sync_buffers"
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        else "broadcast_buffers"
    )
    wrapped = DistributedDataParallel(model, device_ids=devices, **{no_sync: False})
    _KEPT.append(wrapped)
    return wrapped


def share(n_items: int, ctx: RunContext) -> int:
    """How many of an epoch's n_items this rank trains on (all of them alone)."""
    if ctx.rank is None:
        return n_items
    world = ctx.rank.world_size
    if n_items < world:
        raise ValidationFailed(
            f"{n_items} train items cannot be shared among {world} data-parallel ranks; "
            "train on fewer GPUs (an ssh backend's gpus:, SLURM's gres) or label more items"
        )
    return n_items // world


def batches(n_items: int, batch_size: int, ctx: RunContext) -> int:
    """How many batches of *batch_size* this rank takes an epoch of n_items (the last one maybe short)."""
    return math.ceil(share(n_items, ctx) / float(batch_size))


def shard(order: list[int], ctx: RunContext) -> list[int]:
    """This rank's disjoint slice of an epoch's order (the same order on every rank: the run's seed)."""
    if ctx.rank is None:
        return order
    # Strided: batch b of every rank together is batch b of one process with world_size times the batch size.
    return order[ctx.rank.rank :: ctx.rank.world_size][: share(len(order), ctx)]
