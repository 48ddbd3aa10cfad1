"""The typed config: the documented defaults, Potato's path resolution, the Redis URL, sbatch flags."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from potato_queue.config import SBATCH_FLAGS, SlurmBackend
from potato_queue.errors import PotatoQueueError
from potato_queue.runs.job import limits_for
from potato_queue.settings import DEFAULT_REDIS_URL, Settings
from potato_queue.validate import check_file, load_checked, slurm_time_s
from potato_queue.wire.sbatch import SlurmSettings, sbatch_argv
from tests.e2e.runs.test_validate_cli import SEED, seed_config, write_project

pytestmark = pytest.mark.unit


def test_spec_defaults(tmp_path: Path) -> None:
    cfg = seed_config()
    cfg["model_training"]["backends"]["plain"] = {"type": "ssh", "host": "h"}
    cfg["model_training"]["backends"]["ws"] = {"type": "agent"}
    mt = load_checked(write_project(tmp_path, cfg)).model_training
    ssh = mt.backends["plain"]
    assert (ssh.python, ssh.remote_dir, ssh.gpus, ssh.min_free_gpu_mb) == (
        "python3",
        "~/.cache/potato-training",
        "auto",
        2000,
    )
    assert (ssh.max_artifact_mb, ssh.fetch_artifacts, ssh.keep_remote, ssh.heartbeat_timeout_s) == (
        2048,
        True,
        False,
        120,
    )
    assert (mt.grace_seconds, mt.device, mt.max_predictions_mb) == (20, "auto", 512)
    # Every wait that is not run time has a finite bound by default: no run holds the slot forever.
    assert ssh.setup_timeout_s == 1800
    assert (mt.backends["ws"].heartbeat_timeout_s, mt.backends["ws"].queue_timeout_s) == (120, 86400)
    assert mt.backends["ws"].pending_timeout_s == 86400
    cluster = mt.backends["cluster"]
    assert (cluster.setup_timeout_s, cluster.pending_timeout_s) == (1800, 86400)
    assert mt.backends["lab-workstation"].queue_timeout_s == 3600
    assert mt.splits == {"train": 0.7, "val": 0.15, "test": 0.15}


def test_default_backend_and_retrain_backend(tmp_path: Path) -> None:
    cfg = seed_config()
    mt = load_checked(write_project(tmp_path, cfg)).model_training
    assert (mt.default_backend, mt.retrain_backend) == ("gpu-server", "gpu-server")
    del cfg["model_training"]["backend"]
    cfg["model_training"]["auto_retrain"] = {"backend": "cluster"}
    mt = load_checked(write_project(tmp_path, cfg)).model_training
    assert (mt.default_backend, mt.retrain_backend) == ("local", "cluster")
    assert mt.backend_names() == ["local", "gpu-server", "cluster", "lab-workstation"]


def test_paths_resolve_like_potato(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "task" / "data").mkdir(parents=True)
    (project / "task" / "data" / "items.jsonl").write_text('{"id": "a", "text": "x"}\n')
    (project / "config.yaml").write_text(
        "task_dir: task\ndata_files: [{path: data/items.jsonl}]\noutput_annotation_dir: out\n"
        "annotation_schemes: [{annotation_type: radio, name: s, labels: [a, b]}]\n"
    )
    cfg = load_checked(project / "config.yaml")
    assert cfg.task_path == (project / "task").resolve()
    assert cfg.output_path == (project / "task" / "out").resolve()
    assert cfg.data_paths() == [(project / "task" / "data" / "items.jsonl")]


def test_gpus_forms(tmp_path: Path) -> None:
    cfg = seed_config()
    cfg["model_training"]["backends"]["gpu-server"]["gpus"] = 1
    assert load_checked(write_project(tmp_path, cfg)).model_training.backends["gpu-server"].gpus == "1"
    cfg["model_training"]["backends"]["gpu-server"]["gpus"] = "0, 1"
    assert load_checked(write_project(tmp_path, cfg)).model_training.backends["gpu-server"].gpus == "0,1"


def test_settings_come_from_the_environment_handed_in() -> None:
    """The one read of the environment (cli/ hands in os.environ): unset and empty keep the defaults."""
    assert Settings.from_env({}) == Settings()
    assert (
        Settings.from_env({"POTATO_QUEUE_REDIS_URL": ""}).redis_url == DEFAULT_REDIS_URL == "redis://127.0.0.1:6379/0"
    )
    settings = Settings.from_env(
        {
            "POTATO_QUEUE_REDIS_URL": "redis://10.0.0.5:6380/2",
            "POTATO_ADMIN_API_KEY": "k" * 16,
            "POTATO_QUEUE_COPY_STALL_S": "2",
            "POTATO_QUEUE_SSH_CONFIG": "/etc/pq/ssh_config",
        }
    )
    assert (settings.redis_url, settings.admin_api_key, settings.copy_stall_s, settings.ssh_config_file) == (
        "redis://10.0.0.5:6380/2",
        "k" * 16,
        2.0,
        "/etc/pq/ssh_config",
    )


@pytest.mark.parametrize("raw", ["soon", "0", "-5"])
def test_a_timing_that_is_not_seconds_is_refused_with_its_name(raw: str) -> None:
    with pytest.raises(PotatoQueueError) as caught:
        Settings.from_env({"POTATO_QUEUE_VISIBILITY_TIMEOUT_S": raw})
    assert caught.value.message == f"POTATO_QUEUE_VISIBILITY_TIMEOUT_S={raw!r} is not a number of seconds above 0"
    assert caught.value.exit_code == 2 and "unset it for the default" in (caught.value.fix or "")


def test_the_loaded_config_carries_the_settings_it_was_given(tmp_path: Path) -> None:
    cfg = seed_config()
    path = write_project(tmp_path, cfg)
    assert load_checked(path, stream=io.StringIO()).settings == Settings()
    given = Settings(metrics_token="scrape")
    loaded = load_checked(path, stream=io.StringIO(), settings=given)
    assert loaded.settings is given and "settings" not in loaded.model_dump()


def test_every_sbatch_setting_is_a_slurm_key_and_maps_to_its_flag() -> None:
    assert set(SBATCH_FLAGS) <= set(SlurmBackend.model_fields)
    backend = load_checked(SEED / "config.yaml").model_training.backends["cluster"]
    # The agent gets the backend's settings as slurm.json's object and renders sbatch's flags from it.
    settings = SlurmSettings.of(backend.job_settings())
    assert settings.sbatch == {"--gres": "gpu:1", "--time": "04:00:00"}
    assert settings.job_python == backend.job_python and settings.prelude == backend.prelude
    built = SlurmBackend(host="login", remote_dir="/scratch/p", cpus_per_task=8, partition="gpu", mem="32G")
    argv = sbatch_argv(SlurmSettings.of(built.job_settings()), "r1", "/scratch/p/jobs/r1")
    assert argv[:6] == ["sbatch", "--parsable", "--partition=gpu", "--cpus-per-task=8", "--mem=32G", "--no-requeue"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        ("30:15", 1815),
        ("04:00:00", 14400),
        ("1-00", 86400),
        ("1-02:30", 95400),
        ("2-00:00:01", 172801),
        ("4h", None),
        ("", None),
    ],
)
def test_slurm_time_parsing(text: str, seconds: int | None) -> None:
    assert slurm_time_s(text) == seconds


def test_local_run_keys_reach_local_runs_only(tmp_path: Path) -> None:
    """max_ram_mb 2000 suits the annotation VM; before, it reached (and killed) a GPU host's fine-tune, and
    device: cpu forced remote runs onto the CPU."""
    cfg = seed_config()
    cfg["model_training"].update(device="cpu", num_threads=2, max_ram_mb=2000)
    cfg["model_training"]["backends"]["gpu-server"]["num_threads"] = 8
    config = load_checked(write_project(tmp_path, cfg), stream=io.StringIO())
    local, remote = limits_for(config, "local"), limits_for(config, "gpu-server")
    assert (local.device, local.num_threads, local.max_ram_mb) == ("cpu", 2, 2000)
    assert (remote.device, remote.num_threads, remote.max_ram_mb) == ("auto", 8, None)
    assert limits_for(config, "cluster").num_threads is None and limits_for(config, "lab-workstation").device == "auto"
    assert local.max_wall_s == remote.max_wall_s == 3600, "max_wall_seconds is every run's"


def test_validate_warns_of_local_run_keys_under_a_remote_default_and_of_unlisted_secrets(tmp_path: Path) -> None:
    cfg = seed_config()
    cfg["model_training"]["max_ram_mb"] = 2000
    cfg["model_training"]["backends"]["cluster"]["env"] = {"WANDB_API_KEY": "k", "HF_TOKEN": "t", "HF_HOME": "/h"}
    cfg["model_training"]["backends"]["cluster"]["secret_env"] = ["HF_TOKEN"]
    warnings = check_file(write_project(tmp_path, cfg)).warnings
    assert warnings == [
        "model_training.max_ram_mb applies to local runs only, and the default backend is gpu-server: it does not "
        "reach gpu-server's runs; set mem on a slurm backend instead (ssh and agent hosts are not capped)",
        "model_training.backends.cluster.env.WANDB_API_KEY looks like a secret, so it never reaches the trainer (nor "
        "job.sh); if the trainer needs it, add it to secret_env: [WANDB_API_KEY]",
    ]
    del cfg["model_training"]["backend"]
    assert len(check_file(write_project(tmp_path, cfg)).warnings) == 1, "local by default: max_ram_mb is meant"


def test_a_budget_cap_is_a_finite_positive_number_not_infinity_or_a_boolean(tmp_path: Path) -> None:
    """`1e400` (infinity: the budget said `inf left` and capped nothing) and `true` (a cap of 1 GPU-hour) are
    refused, each naming the value."""
    cfg = seed_config()
    cfg["model_training"]["budget"] = {
        "gpu_hours_per_month": True,
        "kwh_per_month": "1e400",
        "backends": {"gpu-server": {"gpu_hours_per_month": 0}},
    }
    errors = check_file(write_project(tmp_path, cfg)).errors
    assert errors == [
        "model_training.budget.gpu_hours_per_month: a cap is a number of GPU-hours or kWh, not true or false (got True)",
        "model_training.budget.kwh_per_month: Input should be a finite number (got '1e400')",
        "model_training.budget.backends.gpu-server.gpu_hours_per_month: Input should be greater than 0 (got 0)",
    ]
    cfg["model_training"]["budget"] = {"gpu_hours_per_month": 200, "backends": {"gpu-server": {"kwh_per_month": 1.5}}}
    assert check_file(write_project(tmp_path, cfg)).errors == []
