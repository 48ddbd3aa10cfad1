"""A run's reproducibility record: what made it, in one place (run.json's and `GET runs/{id}`'s
`reproducibility`), the same fields on every backend.

The server's half (its version, the bundle's digest, the trainer and params, the seeds, the backend) is in the
run's record; the host's half (the code it ran, its Python and packages, CUDA, driver and GPUs, its name)
comes with the worker's result (worker/environment.py, bounded by runs/ingest.py). `differences` names the
fields two records disagree on: what a re-run's comparison shows beside the scores.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from potato_queue import __version__

__all__ = ["FIELDS", "reproducibility", "differences"]

# In the order the page and the CLI show them.
FIELDS = (
    "potato_queue",
    "code_sha256",
    "bundle_digest",
    "trainer",
    "params",
    "seeds",
    "python",
    "packages",
    "cuda",
    "driver",
    "gpus",
    "backend",
    "host",
    "platform",
)
NOT_SENT = "not reported: the worker sends it with its result (a run that ended before one has none)"


def reproducibility(record: Mapping[str, Any], environment: Mapping[str, Any] | None) -> dict[str, Any]:
    """The record of a run that ended: the server's facts from `record`, the host's from `environment`."""
    env = dict(environment or {})
    job = record.get("job") or {}
    params = dict(record.get("params") or {})
    split_seed = job.get("seed")
    return {
        "potato_queue": __version__,
        "code_sha256": env.get("code_sha256") or NOT_SENT,
        "bundle_digest": (record.get("bundle") or {}).get("digest"),
        "trainer": record.get("trainer"),
        "params": params,
        "seeds": {"split_seed": split_seed, "training_seed": params.get("seed", split_seed)},
        "python": env.get("python") or NOT_SENT,
        "packages": env.get("packages") or {},
        "cuda": env.get("cuda"),
        "driver": env.get("driver"),
        "gpus": env.get("gpus") or [],
        "backend": record.get("backend"),
        "host": env.get("host") or NOT_SENT,
        "platform": env.get("platform") or NOT_SENT,
    }


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The fields two records disagree on, each with both values (a package: each version that moved)."""
    found: list[dict[str, Any]] = []
    for name in FIELDS:
        if name == "packages":
            old, new = a.get(name) or {}, b.get(name) or {}
            for package in sorted(set(old) | set(new)):
                if old.get(package) != new.get(package):
                    found.append({"field": f"packages.{package}", "a": old.get(package), "b": new.get(package)})
        elif a.get(name) != b.get(name):
            found.append({"field": name, "a": a.get(name), "b": b.get(name)})
    return found
