"""Every Redis key and every run-directory path, built in one place.

Several projects may share one Redis, so every key starts with the project's
prefix (a hash of its task_dir). A run's files follow Potato's layout under
`<task_dir>/<output_annotation_dir>/training/runs/<run_id>/`.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from potato_queue.config import ProjectConfig

__all__ = [
    "RUN_ID_RE",
    "new_run_id",
    "project_id",
    "Keys",
    "RunPaths",
    "runs_dir",
    "project_predictions_path",
    "remote_socket_path",
    "metrics_tally_path",
    "retrain_state_path",
    "webhook_retry_dir",
    "staging_dir",
    "media_cache_dir",
    "potato_task_dir",
    "potato_database_path",
]

RUN_ID_RE = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{6}$")


def new_run_id(now: datetime | None = None) -> str:
    """Potato's run id: UTC `YYYYmmddTHHMMSS-<6 hex>`."""
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return f"{moment:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def project_id(config: ProjectConfig) -> str:
    return hashlib.sha256(str(config.task_path).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Keys:
    """Redis keys of one project."""

    project: str

    @classmethod
    def of(cls, config: ProjectConfig) -> Keys:
        return cls(project_id(config))

    @property
    def prefix(self) -> str:
        return f"pq:{self.project}"

    @property
    def queue(self) -> str:
        """The Celery queue: one per project, so executors never run another project's runs."""
        return f"potato.training.{self.project}"

    @property
    def runs(self) -> str:
        """Sorted set of run ids by creation time."""
        return f"{self.prefix}:runs"

    @property
    def unfinished(self) -> str:
        """Sorted set of the runs not yet final (queued or in flight), by creation time in ms.

        What the executors look at for every wake-up, instead of listing every
        run's folder; rebuilt from the run folders when Redis was emptied.
        """
        return f"{self.prefix}:unfinished"

    @property
    def bulky(self) -> str:
        """Sorted set (by creation time) of the runs whose folder still holds a bundle or model files."""
        return f"{self.prefix}:bulky"

    @property
    def unwritten(self) -> str:
        """Set of runs whose latest record is held in Redis because their folder could not be written."""
        return f"{self.prefix}:unwritten"

    @property
    def slot(self) -> str:
        """The run slot lease: holds the run id being supervised."""
        return f"{self.prefix}:slot"

    @property
    def alive(self) -> str:
        """Set once the executors have reconciled with disk; gone after a flush or a restart."""
        return f"{self.prefix}:alive"

    @property
    def server_url(self) -> str:
        """The address agents reach the server at (its public URL, behind a proxy)."""
        return f"{self.prefix}:server_url"

    @property
    def server_local_url(self) -> str:
        """The server's own bound address: what an executor on its machine (and an ssh forward) reaches."""
        return f"{self.prefix}:server_local_url"

    def executor(self, name: str) -> str:
        """An executor process that is up (`<host>:<pid>`), refreshed every few seconds with a short expiry."""
        return f"{self.prefix}:executor:{name}"

    @property
    def retrain_lock(self) -> str:
        """Held while one auto-retrain check decides (two beats, or two executors, start one run)."""
        return f"{self.prefix}:retrain:lock"

    @property
    def budget_lock(self) -> str:
        """Held while one submission checks the monthly budget and writes its run: two at once would both fit
        a cap that has room for one."""
        return f"{self.prefix}:budget:lock"

    @property
    def retrain_status(self) -> str:
        """The last auto-retrain check: when, and why it started a run or did not (a hash)."""
        return f"{self.prefix}:retrain:status"

    @property
    def training_events(self) -> str:
        """The training events waiting for their webhook delivery (a list; store/webhooks.py)."""
        return f"{self.prefix}:webhooks:outbox"

    @property
    def executors(self) -> str:
        """The pattern of every executor's key (for SCAN)."""
        return f"{self.prefix}:executor:*"

    def agent_token(self, backend: str) -> str:
        """Hash of an agent backend's registration: the token's sha256, created, last_seen, the agent, and
        gpu_wait (what an agent waiting for a free GPU reported last, until an agent claims)."""
        return f"{self.prefix}:agent:{backend}"

    def agent_token_owner(self, digest: str) -> str:
        """The backend a token digest was issued for (to answer 403, not 401, for another backend's token)."""
        return f"{self.prefix}:agent-digest:{digest}"

    def agent_drain(self, backend: str) -> str:
        """The server's drain switch for an agent backend: set (to when it was switched on) while its agents are
        to finish their run and claim no new one."""
        return f"{self.prefix}:agent:drain:{backend}"

    def offers(self, backend: str) -> str:
        """Sorted set of the runs waiting for an agent of this backend to claim them, oldest first."""
        return f"{self.prefix}:offers:{backend}"

    @property
    def offered(self) -> str:
        """Pub/sub channel: a run was offered to an agent backend (the message is the backend's name)."""
        return f"{self.prefix}:offered"

    def run(self, run_id: str) -> str:
        """Hash of the run's live state (state, step, progress, heartbeat_at, ...)."""
        return f"{self.prefix}:run:{run_id}"

    def metrics(self, run_id: str) -> str:
        """Hash of the run's metrics: `<split>/<name>` to its latest value, as JSON."""
        return f"{self.prefix}:metrics:{run_id}"

    def cancel(self, run_id: str) -> str:
        return f"{self.prefix}:cancel:{run_id}"

    def control(self, run_id: str) -> str:
        """Pub/sub channel that wakes the agent's long-poll on cancel."""
        return f"{self.prefix}:control:{run_id}"

    def result_signal(self, run_id: str) -> str:
        """A list the result call pushes to, so the supervising executor wakes at once."""
        return f"{self.prefix}:result:{run_id}"

    def run_token(self, run_id: str) -> str:
        """sha256 of the run's token (the token itself is never stored)."""
        return f"{self.prefix}:token:{run_id}"

    def publishing(self, run_id: str) -> str:
        """Held (a Lease) while a server process uploads the run's model to the Hugging Face Hub."""
        return f"{self.prefix}:publishing:{run_id}"

    def page_session(self, digest: str) -> str:
        """A Training page session that is signed in, by its nonce's sha256: gone at sign-out or its expiry."""
        return f"{self.prefix}:page-session:{digest}"

    def sign_in_tries(self, client: str) -> str:
        """Hash of one client's recent sign-in tries on the Training page (`tries`, and `until`: no try before)."""
        return f"{self.prefix}:sign-in:{client}"


def remote_socket_path(run_id: str) -> str:
    """An ssh run's socket on the host, reverse-forwarded to the server: in /tmp, where sshd makes it
    0600 (the login account's alone), and unique per launch, since a second forward to a path in use
    silently takes it over."""
    return f"/tmp/potato-queue-{run_id}-{secrets.token_hex(4)}.sock"


def runs_dir(config: ProjectConfig) -> Path:
    return config.output_path / "training" / "runs"


def staging_dir(config: ProjectConfig) -> Path:
    """potato-queue's temp files for what it writes into the project's own folders (the data files): on
    the project's filesystem, so one rename lands them, and never beside the files Potato reads."""
    return config.output_path / "training" / "staging"


def media_cache_dir(config: ProjectConfig) -> Path:
    """The images an image run's items name by web address, fetched once by the server (bundle/remote_media.py),
    one file per address's sha256: the next run's bundle links them and fetches nothing."""
    return config.output_path / "training" / "media_cache"


def webhook_retry_dir(config: ProjectConfig, endpoint: str) -> Path:
    """Where one webhook endpoint's failed deliveries wait for their retry (Potato's sender keeps them in
    `<this>/.webhooks/webhook_retries.db`): one folder per endpoint, so that one that hangs delays no other."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in endpoint)[:80] or "unnamed"
    return config.output_path / "training" / "webhooks" / safe


def metrics_tally_path(config: ProjectConfig) -> Path:
    """/metrics' index of the finished runs' shares (server/run_tally.py): a server's start reads it, not every
    run.json. Beside the runs folder, not in it: the runs folder holds run folders only."""
    return config.output_path / "training" / "metrics_tally.json"


def retrain_state_path(config: ProjectConfig) -> Path:
    """Auto-retrain's baseline (annotations counted at the last auto run): on disk, so restarts keep it."""
    return config.output_path / "training" / "auto_retrain.json"


def potato_task_dir(config: ProjectConfig) -> str:
    """task_dir exactly as Potato's server resolves it (normpath against the config's folder, no `~`, no
    symlinks followed): the key under which Potato's own store finds the project's database."""
    task_dir = config.task_dir or "."
    if os.path.isabs(task_dir):
        return task_dir
    return os.path.normpath(os.path.join(str(config.config_path.parent), task_dir))


def potato_database_path(config: ProjectConfig) -> Path:
    """Potato's project database, which holds its training runs, their splits and every prediction."""
    return Path(potato_task_dir(config)) / "project.sqlite"


def project_predictions_path(config: ProjectConfig) -> Path:
    """The project's published predictions (latest per item and schema)."""
    return config.output_path / "training" / "predictions.jsonl"


@dataclass(frozen=True)
class RunPaths:
    """The on-disk layout of one run (the only place that names its files)."""

    dir: Path

    @classmethod
    def of(cls, config: ProjectConfig, run_id: str) -> RunPaths:
        if not RUN_ID_RE.fullmatch(run_id):
            raise ValueError(f"not a run id: {run_id!r}")
        return cls(runs_dir(config) / run_id)

    @property
    def run_json(self) -> Path:
        return self.dir / "run.json"

    @property
    def run_log(self) -> Path:
        return self.dir / "run.log"

    @property
    def agent_log(self) -> Path:
        return self.dir / "agent.log"

    @property
    def supervised(self) -> Path:
        """Touched by the executor while it supervises the run, Redis or not: the orphan sweep's sign that
        the run's executor lives (a Redis outage silences every other file of the run)."""
        return self.dir / "supervised"

    @property
    def events(self) -> Path:
        return self.dir / "events.jsonl"

    @property
    def bundle(self) -> Path:
        return self.dir / "bundle.tar.gz"

    @property
    def bundle_inputs(self) -> Path:
        """The digest of what the run's bundle was built from (bundle/inputs.py): a later run on the same
        inputs copies this run's bundle instead of building it again."""
        return self.dir / "bundle.inputs"

    @property
    def bundle_dir(self) -> Path:
        """The unpacked bundle the server scores against (val/test targets)."""
        return self.dir / "bundle"

    @property
    def predictions(self) -> Path:
        return self.dir / "predictions.jsonl"

    @property
    def insight_inputs(self) -> Path:
        """What the insight pages read of a succeeded run, worked out once at its finalize (insight/inputs.py)."""
        return self.dir / "insight.json"

    @property
    def predictions_partial(self) -> Path:
        return self.dir / "predictions.jsonl.part"

    @property
    def artifacts(self) -> Path:
        return self.dir / "artifacts"

    @property
    def model_upload(self) -> Path:
        """A ray run's model files as its agent sent them (a manifest line, then a tar), until the executor
        unpacks them into artifacts/."""
        return self.dir / "model.upload"

    @property
    def model_upload_partial(self) -> Path:
        return self.dir / "model.upload.part"

    @property
    def hub_upload(self) -> Path:
        """What a publish uploads, while it does: links to the model files and the generated README.md."""
        return self.dir / "hub-upload"

    @property
    def agent_workdir(self) -> Path:
        """Where a local run's agent keeps its files (bundle copy, worker workdir)."""
        return self.dir / "agent"

    @property
    def local_checkpoints(self) -> Path:
        """Where a local run's agent keeps checkpoints (`<run_id>/` each): beside the run folders, not in one,
        so that a retry (another run folder) finds them; the agent prunes old ones (agent/checkpoints.py)."""
        return self.dir.parent.parent / "checkpoints"

    @property
    def bulky(self) -> tuple[Path, ...]:
        """The large part of a run's folder, which retain_runs removes: bundle, model files, the agent's copies."""
        return (self.bundle_inputs, self.bundle, self.bundle_dir, self.artifacts, self.model_upload, self.agent_workdir)
