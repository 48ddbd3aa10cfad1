"""What a run recorded by an earlier potato-queue lacks, said as that, never as a false reason.

A record without `record_version` (run.py's RECORD_VERSION) was written before this version. Where such a
record lacks a figure the current version records (agreement with the annotators, GPU use, what made the run),
the run page and the API say that the version that wrote it did not record it, instead of a reason that would
hold for a run of today (a succeeded run of today always has `agreement`, empty when no scheme of it is
compared as labels).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from potato_queue.run import RunState

__all__ = ["predates", "EARLIER"]

EARLIER = "recorded by an earlier potato-queue (its run.json has no record_version)"


def predates(record: Mapping[str, Any]) -> dict[str, str]:
    """{what the page shows: why it is missing} for an earlier version's record; {} for today's."""
    if record.get("record_version"):
        return {}
    out = {}
    succeeded = record.get("state") == RunState.SUCCEEDED
    if succeeded and "agreement" not in record:
        out["agreement"] = f"No agreement figures: the run was {EARLIER}, before they were worked out at a run's end."
    if succeeded and "gpu_usage" not in record:
        out["gpu_use"] = f"not recorded: the run was {EARLIER}, before GPU use was measured"
    if succeeded and "reproducibility" not in record:
        out["made_with"] = f"not recorded: the run was {EARLIER}, before what made a run was recorded"
    return out
