"""Every VAL rule through the real `potato-queue validate` (exit codes and messages)."""

from __future__ import annotations

import copy
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from potato_queue.validate import load_checked
from tests.conftest import ROOT, run_cli

SEED = ROOT / "tests" / "fixtures" / "seed_project"
TIME_WARNING = (
    "model_training.backends.cluster.time is 12:00:00. A job that holds a GPU for more than 6 hours "
    "is long on a shared cluster; check its policy"
)


STRONG_KEY = "k3y-of-this-test-suite-9f2c"
PLACEHOLDER_WARNING = (
    "admin_api_key is 'change-me', a placeholder or shorter than 12 characters, which anyone can guess"
)


def seed_config() -> dict[str, Any]:
    """The tutorial's config with a real admin key (the tutorial's placeholder is a warning of its own)."""
    config = yaml.safe_load((SEED / "config.yaml").read_text())
    config["admin_api_key"] = STRONG_KEY
    return config


def write_project(tmp_path: Path, config: dict[str, Any] | str) -> Path:
    shutil.copytree(SEED / "data", tmp_path / "data", dirs_exist_ok=True)
    path = tmp_path / "config.yaml"
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False))
    return path


def validate(path: Path, *flags: str) -> tuple[int, dict[str, list[str]]]:
    """The exit code and the report's lists (whether Potato write-back is on: test_json_shape)."""
    proc = run_cli("validate", path, "--json", *flags)
    report = json.loads(proc.stdout)
    report.pop("potato_writeback", None)
    return proc.returncode, report


def with_backend(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    cfg = seed_config()
    cfg["model_training"]["backends"][name] = entry
    return cfg


def test_seed_example_is_valid_under_strict(tmp_path: Path) -> None:
    proc = run_cli("validate", write_project(tmp_path, seed_config()), "--strict")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "valid (0 error(s), 0 warning(s), 0 acknowledged)" in proc.stdout


def test_the_tutorials_placeholder_admin_key_is_a_warning(tmp_path: Path) -> None:
    code, report = validate(SEED / "config.yaml")
    assert code == 0 and report["errors"] == []
    assert [w for w in report["warnings"] if w.startswith(PLACEHOLDER_WARNING)], report
    assert validate(SEED / "config.yaml", "--strict")[0] == 1


@pytest.mark.parametrize(
    ("kind", "entry", "typo", "suggestion"),
    [
        ("ssh", {"type": "ssh", "host": "gpu", "pyhton": "python3"}, "pyhton", "python"),
        ("ssh", {"type": "ssh", "host": "gpu", "min_free_gpu": 100}, "min_free_gpu", "min_free_gpu_mb"),
        (
            "slurm",
            {"type": "slurm", "host": "login", "remote_dir": "/shared/x", "job_pyhton": "p"},
            "job_pyhton",
            "job_python",
        ),
        (
            "slurm",
            {"type": "slurm", "host": "login", "remote_dir": "/shared/x", "partiton": "gpu"},
            "partiton",
            "partition",
        ),
        ("agent", {"type": "agent", "queue_timeout": 60}, "queue_timeout", "queue_timeout_s"),
    ],
)
def test_misspelled_key_in_each_backend_type_names_path_and_suggests(
    tmp_path: Path, kind: str, entry: dict[str, Any], typo: str, suggestion: str
) -> None:
    code, report = validate(write_project(tmp_path, with_backend("b1", entry)))
    assert code == 1
    assert (
        f"model_training.backends.b1.{typo}: unknown key for a {kind} backend; did you mean '{suggestion}'?"
        in report["errors"]
    )


def test_agent_backend_refuses_ssh_keys(tmp_path: Path) -> None:
    code, report = validate(write_project(tmp_path, with_backend("ws", {"type": "agent", "host": "x"})))
    assert code == 1
    assert any(
        e.startswith("model_training.backends.ws.host: unknown key for a agent backend") for e in report["errors"]
    )


def test_misspelled_model_training_key(tmp_path: Path) -> None:
    cfg = seed_config()
    cfg["model_training"]["max_wall_second"] = 10
    code, report = validate(write_project(tmp_path, cfg))
    assert code == 1
    assert (
        "model_training.max_wall_second: unknown key in model_training; did you mean 'max_wall_seconds'?"
        in report["errors"]
    )


def test_misspelled_writeback_key(tmp_path: Path) -> None:
    cfg = seed_config()
    cfg["model_training"]["writeback"]["min_confidense"] = 0.5
    code, report = validate(write_project(tmp_path, cfg))
    assert code == 1
    assert (
        "model_training.writeback.min_confidense: unknown key in writeback; did you mean 'min_confidence'?"
        in report["errors"]
    )


@pytest.mark.parametrize("kind", ["ssh", "slurm"])
def test_remote_backend_without_host(tmp_path: Path, kind: str) -> None:
    entry = {"type": kind, "remote_dir": "/shared/x"} if kind == "slurm" else {"type": kind}
    code, report = validate(write_project(tmp_path, with_backend("nohost", entry)))
    assert code == 1
    assert any(
        e.startswith(f"model_training.backends.nohost.host is required for a {kind} backend") for e in report["errors"]
    )


@pytest.mark.parametrize("remote_dir", ["/tmp/potato", "/var/tmp/jobs", "/tmp"])
def test_slurm_remote_dir_under_tmp(tmp_path: Path, remote_dir: str) -> None:
    code, report = validate(
        write_project(tmp_path, with_backend("c", {"type": "slurm", "host": "l", "remote_dir": remote_dir}))
    )
    assert code == 1
    assert (
        f"model_training.backends.c.remote_dir is {remote_dir}, which is local to each node; use a folder on storage the login and compute nodes share"
        in report["errors"]
    )


def test_slurm_remote_dir_that_only_looks_like_tmp_is_fine(tmp_path: Path) -> None:
    code, report = validate(
        write_project(tmp_path, with_backend("c", {"type": "slurm", "host": "l", "remote_dir": "/tmpfs-shared/jobs"}))
    )
    assert code == 0, report


def test_slurm_without_remote_dir(tmp_path: Path) -> None:
    code, report = validate(write_project(tmp_path, with_backend("c", {"type": "slurm", "host": "l"})))
    assert code == 1
    assert any(
        e.startswith("model_training.backends.c.remote_dir is required for a slurm backend") for e in report["errors"]
    )


def test_packages_on_slurm_is_refused_with_the_reason(tmp_path: Path) -> None:
    entry = {"type": "slurm", "host": "l", "remote_dir": "/shared/x", "packages": ["peft"]}
    code, report = validate(write_project(tmp_path, with_backend("c", entry)))
    assert code == 1
    assert any(
        e.startswith("model_training.backends.c.packages: not accepted on a slurm backend") and "job_python" in e
        for e in report["errors"]
    )


def test_packages_on_ssh_is_accepted(tmp_path: Path) -> None:
    entry = {"type": "ssh", "host": "g", "packages": ["transformers>=4.46.0", "peft>=0.13.0"], "num_threads": 8}
    code, report = validate(write_project(tmp_path, with_backend("g2", entry)), "--strict")
    assert (code, report["errors"]) == (0, [])


@pytest.mark.parametrize("key", ["backend", "auto_retrain"])
def test_default_or_retrain_backend_naming_no_backend(tmp_path: Path, key: str) -> None:
    cfg = seed_config()
    if key == "backend":
        cfg["model_training"]["backend"] = "gpu-servr"
        path = "model_training.backend"
    else:
        cfg["model_training"]["auto_retrain"] = {"enabled": True, "backend": "clustr"}
        path = "model_training.auto_retrain.backend"
    code, report = validate(write_project(tmp_path, cfg))
    assert code == 1
    wanted = "gpu-server" if key == "backend" else "cluster"
    (err,) = [e for e in report["errors"] if e.startswith(path)]
    assert "which names no backend (configured: local, gpu-server, cluster, lab-workstation)" in err
    assert err.endswith(f"did you mean '{wanted}'?")


@pytest.mark.parametrize(
    ("retrain", "wanted"),
    [
        (
            {"enabled": True},
            "model_training.auto_retrain.trainer is missing: auto-retrain is enabled and needs one "
            "(trainers: decision-calibrate, hf-image-classification, hf-llm-lora, hf-text-classification, "
            "hf-token-classification, "
            "majority-baseline, sklearn-text, "
            "potato-queue-remote)",
        ),
        (
            {"enabled": True, "trainer": "sklearn-txt"},
            "model_training.auto_retrain.trainer is 'sklearn-txt', which is no "
            "trainer (trainers: decision-calibrate, hf-image-classification, hf-llm-lora, hf-text-classification, "
            "hf-token-classification, "
            "majority-baseline, sklearn-text, "
            "potato-queue-remote); did you mean 'sklearn-text'?",
        ),
    ],
)
def test_an_enabled_auto_retrain_needs_a_real_trainer(tmp_path: Path, retrain: dict[str, object], wanted: str) -> None:
    cfg = seed_config()
    cfg["model_training"]["auto_retrain"] = retrain
    code, report = validate(write_project(tmp_path, cfg))
    assert code == 1 and wanted in report["errors"], report["errors"]


def test_auto_retrain_schemas_its_trainer_does_not_train_are_an_error(tmp_path: Path) -> None:
    cfg = seed_config()
    cfg["annotation_schemes"].append(
        {"annotation_type": "multiselect", "name": "topics", "labels": ["plot", "music"], "description": "Topics"}
    )
    cfg["model_training"]["auto_retrain"] = {
        "enabled": True,
        "trainer": "majority-baseline",
        "schemas": [cfg["annotation_schemes"][0]["name"], "topics"],
    }
    code, report = validate(write_project(tmp_path, cfg))
    assert code == 1
    assert [e for e in report["errors"] if "auto_retrain.schemas" in e] == [
        "model_training.auto_retrain.schemas names 'topics', which is multilabel, and its trainer majority-baseline "
        "trains only nominal schemes: every auto run would be refused; train it with hf-llm-lora or hf-text-classification or sklearn-text"
    ]


def test_backend_local_is_always_there(tmp_path: Path) -> None:
    cfg = seed_config()
    cfg["model_training"]["backend"] = "local"
    cfg["model_training"]["auto_retrain"] = {"backend": "lab-workstation"}
    code, report = validate(write_project(tmp_path, cfg), "--strict")
    assert (code, report["errors"]) == (0, [])


def test_unknown_backend_type(tmp_path: Path) -> None:
    code, report = validate(write_project(tmp_path, with_backend("k", {"type": "kubernetes", "host": "x"})))
    assert code == 1
    assert any(
        e.startswith("model_training.backends.k.type is 'kubernetes'; it must be ssh, slurm or agent")
        for e in report["errors"]
    )


def test_entry_named_local_is_refused(tmp_path: Path) -> None:
    code, report = validate(write_project(tmp_path, with_backend("local", {"type": "agent"})))
    assert code == 1
    assert any("'local' is built in" in e for e in report["errors"])


def test_wrong_value_types_name_path_and_value(tmp_path: Path) -> None:
    entry = {"type": "ssh", "host": "g", "port": "twenty-two", "gpus": "first"}
    code, report = validate(write_project(tmp_path, with_backend("g2", entry)))
    assert code == 1
    errors = "\n".join(report["errors"])
    assert "model_training.backends.g2.port: Input should be a valid integer" in errors and "'twenty-two'" in errors
    assert "model_training.backends.g2.gpus: must be auto, none" in errors and "'first'" in errors
    assert errors.count("(got 'first')") == 1, errors  # the validator names the value; it is not said twice


def test_writeback_schema_must_exist(tmp_path: Path) -> None:
    cfg = seed_config()
    cfg["model_training"]["writeback"]["schemas"] = ["sentimnet"]
    code, report = validate(write_project(tmp_path, cfg))
    assert code == 1
    assert (
        "model_training.writeback.schemas names 'sentimnet', which is not an annotation scheme (schemes: sentiment)"
        in report["errors"]
    )


def test_missing_data_file_is_an_error_with_where_it_looked(tmp_path: Path) -> None:
    cfg = seed_config()
    cfg["data_files"] = ["data/missing.jsonl"]
    code, report = validate(write_project(tmp_path, cfg))
    assert code == 1
    assert (
        f"data_files[0] is 'data/missing.jsonl', which does not exist (looked for {tmp_path.resolve()}/data/missing.jsonl)"
        in report["errors"]
    )


def long_job_config(ack: list[str] | None = None) -> dict[str, Any]:
    cfg = seed_config()
    cfg["model_training"]["backends"]["cluster"]["time"] = "12:00:00"
    if ack is not None:
        cfg["validation"] = {"acknowledge": ack}
    return cfg


def test_long_slurm_time_warns_and_fails_strict_only(tmp_path: Path) -> None:
    path = write_project(tmp_path, long_job_config())
    assert validate(path) == (0, {"errors": [], "warnings": [TIME_WARNING], "acknowledged": []})
    code, report = validate(path, "--strict")
    assert code == 1 and report["warnings"] == [TIME_WARNING]
    text = run_cli("validate", path, "--strict")
    assert f"warning: {TIME_WARNING}" in text.stdout
    assert "fails --strict" in text.stdout


def test_unquoted_yaml_time_is_read_as_slurm_time_not_base_60(tmp_path: Path) -> None:
    text = (SEED / "config.yaml").read_text().replace('time: "04:00:00"', "time: 12:00:00")
    text = text.replace('admin_api_key: "change-me"', f'admin_api_key: "{STRONG_KEY}"')
    code, report = validate(write_project(tmp_path, text))
    assert report["warnings"] == [TIME_WARNING]


@pytest.mark.parametrize(
    ("time", "warns"),
    [("06:00:00", False), ("06:00:01", True), ("1-00:00:00", True), ("360", False), ("361", True), ("infinite", True)],
)
def test_slurm_time_forms(tmp_path: Path, time: str, warns: bool) -> None:
    cfg = seed_config()
    cfg["model_training"]["backends"]["cluster"]["time"] = time
    code, report = validate(write_project(tmp_path, cfg), "--strict")
    assert (code == 1) == warns and bool(report["warnings"]) == warns


def test_unreadable_slurm_time_is_an_error(tmp_path: Path) -> None:
    cfg = seed_config()
    cfg["model_training"]["backends"]["cluster"]["time"] = "4h"
    code, report = validate(write_project(tmp_path, cfg))
    assert code == 1
    assert any(
        e.startswith("model_training.backends.cluster.time is '4h', which sbatch does not read")
        for e in report["errors"]
    )


def test_acknowledged_warning_passes_strict(tmp_path: Path) -> None:
    path = write_project(tmp_path, long_job_config(["model_training.backends.cluster.time is"]))
    code, report = validate(path, "--strict")
    assert code == 0
    assert report == {"errors": [], "warnings": [], "acknowledged": [TIME_WARNING]}
    assert f"acknowledged: {TIME_WARNING}" in run_cli("validate", path, "--strict").stdout


def test_a_starting_process_still_says_an_acknowledged_warning_marked_as_such(tmp_path: Path) -> None:
    """acknowledge is for validate --strict; before, the server started in silence about the 12-hour job."""
    path = write_project(tmp_path, long_job_config(["model_training.backends.cluster.time is"]))
    said = io.StringIO()
    load_checked(path, stream=said)
    assert said.getvalue() == f"warning (acknowledged in validation.acknowledge): {TIME_WARNING}\n"


def test_ack_naming_a_backend_acknowledges_only_that_backend(tmp_path: Path) -> None:
    cfg = long_job_config(["model_training.backends.cluster"])
    other = copy.deepcopy(cfg["model_training"]["backends"]["cluster"])
    cfg["model_training"]["backends"]["cluster-big"] = other
    code, report = validate(write_project(tmp_path, cfg), "--strict")
    assert code == 1
    assert report["acknowledged"] == [TIME_WARNING]
    assert report["warnings"] == [TIME_WARNING.replace("backends.cluster.", "backends.cluster-big.")]


def test_ack_without_backend_covers_every_backend(tmp_path: Path) -> None:
    cfg = long_job_config(["A job that holds a GPU for more than 6 hours"])
    cfg["model_training"]["backends"]["cluster-big"] = copy.deepcopy(cfg["model_training"]["backends"]["cluster"])
    code, report = validate(write_project(tmp_path, cfg), "--strict")
    assert code == 0 and len(report["acknowledged"]) == 2


def test_ack_entry_too_short_is_a_warning(tmp_path: Path) -> None:
    code, report = validate(write_project(tmp_path, long_job_config(["time is"])), "--strict")
    assert code == 1
    assert (
        "validation.acknowledge entry 'time is' is shorter than 12 characters; quote more of the warning it acknowledges"
        in report["warnings"]
    )
    assert TIME_WARNING in report["warnings"]


def test_ack_entry_matching_nothing_is_a_warning(tmp_path: Path) -> None:
    code, report = validate(
        write_project(tmp_path, long_job_config(["model_training.backends.gpu-server.time"])), "--strict"
    )
    assert code == 1
    assert (
        "validation.acknowledge entry 'model_training.backends.gpu-server.time' matches no warning; remove it"
        in report["warnings"]
    )


def test_ack_is_case_sensitive(tmp_path: Path) -> None:
    code, report = validate(
        write_project(tmp_path, long_job_config(["MODEL_TRAINING.BACKENDS.CLUSTER.TIME"])), "--strict"
    )
    assert code == 1 and report["acknowledged"] == []


def test_yaml_syntax_error_exits_2_with_line_and_column(tmp_path: Path) -> None:
    path = write_project(tmp_path, "annotation_task_name: x\nmodel_training:\n  enabled: true\n    backend: a\n")
    proc = run_cli("validate", path)
    assert proc.returncode == 2
    assert "is not valid YAML at line 4, column 12" in proc.stderr


def test_missing_file_exits_2(tmp_path: Path) -> None:
    proc = run_cli("validate", tmp_path / "nope.yaml")
    assert proc.returncode == 2
    assert "nope.yaml does not exist" in proc.stderr


def test_not_a_mapping_exits_2(tmp_path: Path) -> None:
    proc = run_cli("validate", write_project(tmp_path, "- just\n- a list\n"))
    assert proc.returncode == 2
    assert "not a Potato config" in proc.stderr


def test_json_shape(tmp_path: Path) -> None:
    path = write_project(tmp_path, seed_config())
    proc = run_cli("validate", path, "--json")
    db = path.parent / "project.sqlite"
    assert json.loads(proc.stdout) == {
        "errors": [],
        "warnings": [],
        "acknowledged": [],
        "potato_writeback": {
            "on": True,
            "why": f"runs, their splits and predictions are recorded in {db} (potato-annotation 2.12.1)",
            "fix": None,
        },
    }
