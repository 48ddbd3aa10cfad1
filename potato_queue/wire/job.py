"""The job: what one run asks of an agent, in one typed shape from the executor to the worker.

Standard library only, Python 3.8+ (the agent and the worker run on bare
hosts). The executor builds a `Job` (runs/job.py) and keeps it in run.json;
the server serves the same object at GET job (and documents it: FastAPI reads
these dataclasses); the agent reads it back with `Job.from_dict` and writes the
worker's spec.json from it with `worker_spec`, which the worker parses
(spec.py). `Limits` is the one definition of a run's limits, for both.
"""

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

__all__ = ["Job", "Limits", "GpuWatch", "BundleRef", "JobError", "SPEC_VERSION"]

SPEC_VERSION = 1  # spec.json's `v` (Potato's worker spec)
# resume_of names a folder on the training machine: a run id's characters, never a path.
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class JobError(ValueError):
    """A job that is not one (a server too old or too new for this agent, or a damaged record)."""


@dataclass
class Limits:
    """The worker's limits: wall time (enforced by the agent and the executor), RAM, device, threads."""

    max_wall_s: Optional[float] = None
    max_ram_mb: Optional[float] = None
    device: str = "auto"
    num_threads: Optional[int] = None


@dataclass
class GpuWatch:
    """What the agent does with the run's GPUs (agent/gpu_watch.py; model_training.gpu_watch): how often it
    samples them, the idle guard (off while idle_stop_s is None) and the leak guard after the run."""

    sample_s: float = 10.0
    idle_utilization_pct: float = 5.0
    idle_stop_s: Optional[float] = None
    leak_guard: bool = True

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> "GpuWatch":
        """As the job (or spec.json, for a SLURM job's meter) carries it; the defaults for what it lacks (a server
        older than the GPU watch sends none). ValueError or TypeError for a value of the wrong kind."""
        default = cls()
        stop = raw.get("idle_stop_s")
        return cls(
            sample_s=float(raw.get("sample_s", default.sample_s)),
            idle_utilization_pct=float(raw.get("idle_utilization_pct", default.idle_utilization_pct)),
            idle_stop_s=None if stop is None else float(stop),
            leak_guard=bool(raw.get("leak_guard", default.leak_guard)),
        )


@dataclass
class BundleRef:
    """bundle.tar.gz as the server holds it: the agent refuses a download that differs."""

    bytes: int
    sha256: str


@dataclass
class Job:
    """Everything an agent needs to run the worker."""

    run_id: str
    trainer: str
    schemas: List[str]
    bundle: BundleRef
    heartbeat_interval_s: float  # post an (empty) events batch at least this often
    max_predictions_bytes: int  # PUT predictions larger than this is refused
    params: Dict[str, Any] = field(default_factory=dict)
    seed: Optional[int] = None
    grace_seconds: Optional[float] = None  # SIGTERM to SIGKILL on cancel; the agent's default when None
    limits: Limits = field(default_factory=Limits)
    # A retry: the run whose checkpoints (on the training machine) this one resumes from; None: its own.
    resume_of: Optional[str] = None
    gpu_watch: GpuWatch = field(default_factory=GpuWatch)
    # The model files go to the server (PUT model) after a worker's success, each up to this many bytes (the
    # bigger stay on the machine); None: they all stay there, as the executor fetches or reports them.
    send_model_max_bytes: Optional[int] = None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "Job":
        """The job as JSON gave it; JobError naming what is missing or of the wrong kind."""
        if not isinstance(data, dict):
            raise JobError("the job must be a JSON object, got {}".format(type(data).__name__))
        try:
            bundle = data["bundle"]
            limits = data.get("limits") or {}
            resume_of = data.get("resume_of")
            if resume_of is not None and not _RUN_ID.fullmatch(str(resume_of)):
                raise ValueError("resume_of is not a run id: {!r}".format(resume_of))
            return cls(
                run_id=str(data["run_id"]),
                trainer=str(data["trainer"]),
                schemas=[str(s) for s in data["schemas"]],
                bundle=BundleRef(int(bundle["bytes"]), str(bundle["sha256"])),
                heartbeat_interval_s=float(data["heartbeat_interval_s"]),
                max_predictions_bytes=int(data["max_predictions_bytes"]),
                params=dict(data.get("params") or {}),
                seed=data.get("seed"),
                grace_seconds=None if data.get("grace_seconds") is None else float(data["grace_seconds"]),
                limits=Limits(**{k: v for k, v in limits.items() if k in Limits.__dataclass_fields__}),
                resume_of=None if resume_of is None else str(resume_of),
                gpu_watch=GpuWatch.from_dict(data.get("gpu_watch") or {}),
                send_model_max_bytes=_optional_int(data.get("send_model_max_bytes")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise JobError("the job is malformed ({}: {})".format(type(exc).__name__, exc)) from None

    def worker_spec(
        self, bundle_dir: str, workdir: str, checkpoint_dir: Optional[str] = None, gpus: Optional[str] = None
    ) -> Dict[str, Any]:
        """spec.json's object: what the worker parses (spec.parse_spec)."""
        spec = {
            "v": SPEC_VERSION,
            "run_id": self.run_id,
            "trainer": self.trainer,
            "schemas": list(self.schemas),
            "bundle_dir": bundle_dir,
            "workdir": workdir,
            "params": dict(self.params),
            "seed": self.seed,
            "limits": asdict(self.limits),
        }
        if checkpoint_dir is not None:
            spec["checkpoint_dir"] = checkpoint_dir
        if gpus is not None:
            spec["gpus"] = gpus
        # Ours beyond Potato's spec, read by a SLURM job's GPU meter (agent/gpu_meter.py), not by the worker.
        spec["gpu_watch"] = asdict(self.gpu_watch)
        return spec


def _optional_int(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("not a byte count: {!r}".format(value))
    return value
