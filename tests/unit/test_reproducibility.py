"""A run's reproducibility record, in process: the worker's half as a hostile worker may send it (bounded),
the driver read from nvidia-smi (a stand-in script: this machine has no GPU), the record's fields and the
differences between two records. On every backend, through real runs: tests/e2e/runs/test_contract.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from potato_queue.runs.ingest import MAX_GPUS, MAX_PACKAGES, environment_of
from potato_queue.runs.reproducibility import NOT_SENT, differences, reproducibility
from potato_queue.worker import environment as worker_environment

pytestmark = pytest.mark.unit

RECORD = {
    "trainer": "hf-text-classification",
    "params": {"epochs": 3},
    "backend": "gpu-server",
    "job": {"seed": 7},
    "bundle": {"digest": "d" * 64},
}


def test_the_worker_says_its_python_the_packages_the_run_imported_and_its_code() -> None:
    import sklearn

    found = worker_environment.environment()
    assert found["python"] and found["host"] and found["code_sha256"] == worker_environment.code_sha256()
    assert found["packages"]["scikit-learn"] == sklearn.__version__ and len(found["code_sha256"]) == 64


def test_the_driver_is_nvidia_smis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in nvidia-smi (no GPU here): the driver version is its first answer line."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 550.54.15\necho 550.54.15\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert worker_environment._driver() == "550.54.15"  # noqa: SLF001 - the one function that reads it


def test_a_hostile_environment_is_cut_to_its_fields_and_sizes() -> None:
    sent = {
        "host": "h" * 100_000,
        "python": ["not", "text"],
        "packages": {f"p{n}": "1" for n in range(1000)},
        "gpus": ["A100"] * 1000,
        "evil": {"deep": "x"},
    }
    found = environment_of(sent)
    assert found is not None and "evil" not in found
    assert len(found["packages"]) == MAX_PACKAGES and len(found["gpus"]) == MAX_GPUS
    assert len(found["host"]) < 10_000
    assert environment_of("no") is None


def test_the_record_joins_the_servers_half_and_the_hosts() -> None:
    env = {
        "host": "gpu1",
        "python": "3.11.7",
        "packages": {"torch": "2.13.0"},
        "code_sha256": "c" * 64,
        "gpus": ["H100"],
    }
    record = reproducibility(RECORD, env)
    assert record["seeds"] == {"split_seed": 7, "training_seed": 7}
    assert (record["bundle_digest"], record["host"], record["gpus"]) == ("d" * 64, "gpu1", ["H100"])
    assert reproducibility({**RECORD, "params": {"seed": 3}}, env)["seeds"]["training_seed"] == 3
    assert reproducibility(RECORD, None)["python"] == NOT_SENT


def test_differences_name_each_field_and_package_that_moved() -> None:
    a = reproducibility(RECORD, {"host": "gpu1", "packages": {"torch": "2.12.0", "peft": "0.13"}, "gpus": ["H100"]})
    b = reproducibility(RECORD, {"host": "gpu2", "packages": {"torch": "2.13.0", "peft": "0.13"}, "gpus": ["H100"]})
    assert differences(a, b) == [
        {"field": "packages.torch", "a": "2.12.0", "b": "2.13.0"},
        {"field": "host", "a": "gpu1", "b": "gpu2"},
    ]
    assert differences(a, a) == []
