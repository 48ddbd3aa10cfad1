"""A run's GPUs while its worker runs and after: what they cost, whether they idle, and what of the run is
left holding them.

Standard library only, Python 3.8+: it runs next to the worker (the local, ssh and agent backends; a SLURM
job's GPUs are on a compute node the agent does not run on). Three parts:

- `UsageMeter` (pure, times handed in): nvidia-smi's samples of the run's GPUs integrated into GPU-seconds,
  watt-hours (power over time, the first and last samples held to the run's start and end), mean
  utilization and peak memory; and how long the GPUs have stayed under the idle floor.
- `GpuWatch`: the sampling thread (one nvidia-smi call every `sample_s`, tens of milliseconds of CPU) and
  the idle guard's words; `usage()` is the `usage` event the runner sends with the result.
- `stop_leftovers`: after the worker's process group is gone, the processes nvidia-smi still lists that are
  the run's (their environment names its run id: wire/isolated.RUN_ID_VAR) are killed and named.
"""

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from potato_queue.agent.launchers.process import read_process
from potato_queue.host.nvidia_smi import (
    APPS_QUERY,
    NVIDIA_SMI_QUERY,
    USAGE_QUERY,
    GpuApp,
    GpuSample,
    parse_apps,
    parse_gpus,
    parse_usage,
    visible_gpus,
)
from potato_queue.wire.isolated import RUN_ID_VAR
from potato_queue.wire.job import GpuWatch as GpuWatchSettings

__all__ = [
    "UsageMeter",
    "GpuWatch",
    "idle_verdict",
    "run_gpus",
    "leftovers",
    "stop_leftovers",
    "IDLE_FIX",
    "SMI_TIMEOUT_S",
    "USAGE_REPORT_S",
]

# A hung nvidia-smi (a driver in trouble) must not hold the run's sampling, or its end, for long.
SMI_TIMEOUT_S = 10.0
# How often the usage so far is sent while the run lasts (the page shows it; a budget counts it).
USAGE_REPORT_S = 60.0
# After SIGKILL, how long a leftover may take to leave the GPU's list of processes.
LEFTOVER_WAIT_S = 5.0
IDLE_FIX = (
    "make the trainer use the GPU (a device of cuda, a batch large enough to keep it busy), or raise "
    "model_training.gpu_watch.idle_stop_s (remove it to turn the idle guard off)"
)

Log = Callable[[str], None]


def smi(query: Sequence[str]) -> Optional[str]:
    """nvidia-smi's answer to `query`, or None when it failed or took over SMI_TIMEOUT_S. Bounded even when
    nvidia-smi hangs in the driver (then it cannot be reaped either: it is killed and left, not waited for)."""
    try:
        proc = subprocess.Popen(list(query), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    try:
        out, _ = proc.communicate(timeout=SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(1.0)
        except subprocess.TimeoutExpired:
            pass
        return None
    return out.decode(errors="replace") if proc.returncode == 0 else None


def run_gpus(device: str, visible_devices: Optional[str]) -> "tuple[List[int], Optional[str]]":
    """(the GPUs the run was given, by nvidia-smi's index; why none, when none). `visible_devices` is what
    the agent gave the run (its GPU pick) or None: the agent's own CUDA_VISIBLE_DEVICES."""
    host = socket.gethostname()
    if device == "cpu":
        return [], "the run was on the CPU (device: cpu)"
    if shutil.which("nvidia-smi") is None:
        return [], "no nvidia-smi on {}'s PATH: a CPU-only host".format(host)
    visible = visible_devices if visible_devices is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    answer = smi(NVIDIA_SMI_QUERY)
    if answer is None:
        return [], "nvidia-smi on {} failed or did not answer in {:g} s: the GPUs could not be read".format(
            host, SMI_TIMEOUT_S
        )
    gpus = visible_gpus(parse_gpus(answer), visible)
    if not gpus:
        given = "" if visible is None else " (CUDA_VISIBLE_DEVICES={!r})".format(visible)
        return [], "the run was given no GPU on {}{}".format(host, given)
    return [gpu.index for gpu in gpus], None


class UsageMeter:
    """The samples of a run's GPUs, integrated. Times are monotonic seconds, handed in (tests give their own)."""

    def __init__(self, indexes: Sequence[int], start_s: float, idle_floor_pct: float) -> None:
        self.indexes = list(indexes)
        self.start_s = start_s
        self.idle_floor_pct = idle_floor_pct
        self.samples = 0
        self._energy_ws = 0.0
        self._last = {}  # type: Dict[int, tuple]  # index -> (t_s, power_w) of its last sample with a power
        self._first_power = {}  # type: Dict[int, tuple]
        self._utilization_sum = 0.0
        self._utilization_n = 0
        self.peak_memory_mb = None  # type: Optional[float]
        self.busy_at_s = start_s  # the last time a GPU of the run was at or above the idle floor
        self.power_known = False

    def add(self, t_s: float, samples: Sequence[GpuSample]) -> None:
        """One look at the GPUs (samples of other GPUs are left out)."""
        ours = [sample for sample in samples if sample.index in self.indexes]
        if not ours:
            return
        self.samples += 1
        busy = False
        memory = 0.0
        for sample in ours:
            if sample.power_w is not None:
                self.power_known = True
                last = self._last.get(sample.index)
                if last is None:
                    self._first_power[sample.index] = (t_s, sample.power_w)
                else:
                    self._energy_ws += (t_s - last[0]) * (last[1] + sample.power_w) / 2.0
                self._last[sample.index] = (t_s, sample.power_w)
            if sample.utilization_pct is None or sample.utilization_pct >= self.idle_floor_pct:
                busy = True  # a GPU that does not say how busy it is is never taken for idle
            if sample.utilization_pct is not None:
                self._utilization_sum += sample.utilization_pct
                self._utilization_n += 1
            memory += sample.memory_used_mb or 0.0
        if busy:
            self.busy_at_s = t_s
        self.peak_memory_mb = memory if self.peak_memory_mb is None else max(self.peak_memory_mb, memory)

    def idle_s(self, now_s: float) -> float:
        """How long every GPU of the run has stayed under the idle floor, up to now (0 before a first sample:
        a GPU not yet seen is not idle)."""
        return max(0.0, now_s - self.busy_at_s) if self.samples else 0.0

    def energy_wh(self, end_s: float) -> Optional[float]:
        """Watt-hours from the run's start to `end_s`; None when no GPU reported its power."""
        if not self.power_known:
            return None
        total = self._energy_ws
        for t_s, power_w in self._first_power.values():
            total += max(0.0, t_s - self.start_s) * power_w
        for t_s, power_w in self._last.values():
            total += max(0.0, end_s - t_s) * power_w
        return total / 3600.0

    def summary(self, end_s: float, sample_s: float) -> Dict[str, Any]:
        """The `usage` event's fields."""
        energy = self.energy_wh(end_s)
        mean = self._utilization_sum / self._utilization_n if self._utilization_n else None
        return {
            "gpus": [str(index) for index in self.indexes],
            "gpu_seconds": round(max(0.0, end_s - self.start_s) * len(self.indexes), 6),
            "energy_wh": None if energy is None else round(energy, 6),
            "mean_utilization_pct": None if mean is None else round(mean, 1),
            "peak_memory_mb": self.peak_memory_mb,
            "samples": self.samples,
            "sample_s": sample_s,
        }


class GpuWatch:
    """Samples the run's GPUs every `settings.sample_s` from a thread, from start() to stop(); or, for a worker
    that runs elsewhere, reads what the meter beside it wrote (`remote`: a SLURM job's gpu_usage.json)."""

    def __init__(
        self,
        indexes: Sequence[int],
        why_none: Optional[str],
        settings: GpuWatchSettings,
        remote: Optional[Callable[[], Optional[Dict[str, Any]]]] = None,
    ) -> None:
        self.settings = settings
        self.why_none = why_none
        self.remote = remote
        self.meter = UsageMeter(indexes, time.monotonic(), settings.idle_utilization_pct)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = None  # type: Optional[threading.Thread]
        self.warned = False
        self.ended_s = None  # type: Optional[float]

    @property
    def measures(self) -> bool:
        return bool(self.meter.indexes) or self.remote is not None

    def start(self) -> "GpuWatch":
        self.meter.start_s = self.meter.busy_at_s = time.monotonic()
        if self.meter.indexes:
            self._thread = threading.Thread(target=self._sample_forever, name="gpu-watch", daemon=True)
            self._thread.start()
        return self

    def _sample_forever(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(self.settings.sample_s):
                return

    def sample_once(self) -> None:
        answer = smi(USAGE_QUERY)
        if answer is None:
            return  # a missed look: the next one counts, and the integration spans the gap
        with self._lock:
            self.meter.add(time.monotonic(), parse_usage(answer))

    def stop(self) -> Dict[str, Any]:
        """The last sample taken, sampling ended: the run's usage (the `usage` event's fields)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(SMI_TIMEOUT_S + 1.0)
            if not self._thread.is_alive():  # a sampler stuck in nvidia-smi: its GPU is not asked again
                self.sample_once()
        self.ended_s = time.monotonic()
        return self.usage()

    def _remote(self) -> Optional[Dict[str, Any]]:
        found = self.remote() if self.remote is not None else None
        return found if found and found.get("gpus") else None

    def usage(self) -> Dict[str, Any]:
        """The usage so far (or, after stop(), the run's): GPU-seconds, watt-hours, utilization, memory."""
        if self.remote is not None:
            found = self.remote()
            if found and (found.get("gpus") or found.get("why")):
                return found  # the meter's figures, or its own word of why it measured none
            return {"gpus": [], "why": self.why_none}
        if not self.measures:
            return {"gpus": [], "why": self.why_none}
        with self._lock:
            return self.meter.summary(self.ended_s or time.monotonic(), self.settings.sample_s)

    def idle_check(self) -> "tuple[Optional[str], Optional[str]]":
        """(a warning for the step line, once; the reason to stop the run) from the idle guard; both None
        while it is off, the GPUs are busy, or the run measures no GPU."""
        if not self.settings.idle_stop_s or not self.measures:
            return None, None
        if self.remote is not None:
            found = self._remote()
            if found is None:
                return None, None
            gpus, idle_s = [str(g) for g in found["gpus"]], float(found.get("idle_s") or 0.0)
        else:
            with self._lock:
                idle_s = self.meter.idle_s(time.monotonic())
            gpus = [str(index) for index in self.meter.indexes]
        warning, stop, self.warned = idle_verdict(gpus, idle_s, self.settings, self.warned)
        return warning, stop


def idle_verdict(
    gpus: Sequence[str], idle_s: float, settings: GpuWatchSettings, warned: bool
) -> "tuple[Optional[str], Optional[str], bool]":
    """The idle guard's words for GPUs idle `idle_s`: (a warning, once, at half the limit; the reason to stop,
    past it; whether it has warned now)."""
    limit_s = settings.idle_stop_s or 0.0
    floor = "{:g}%".format(settings.idle_utilization_pct)
    named = ", ".join("GPU {}".format(gpu) for gpu in gpus)
    if idle_s >= limit_s:
        return (
            None,
            "the run's GPUs ({}) stayed under {} utilization for {:.0f} s, past "
            "model_training.gpu_watch.idle_stop_s ({:g} s): the idle guard stopped the run".format(
                named, floor, idle_s, limit_s
            ),
            warned,
        )
    if idle_s >= limit_s / 2 and not warned:
        return (
            "the run's GPUs ({}) have been under {} utilization for {:.0f} s: the idle guard stops the run "
            "at {:g} s unless they get busy".format(named, floor, idle_s, limit_s),
            None,
            True,
        )
    return None, None, warned and idle_s >= limit_s / 2  # busy again: a later idle spell is warned of again


def _environ_names_run(pid: int, run_id: str) -> bool:
    """Whether the process's environment carries the run's id; False for another account's (unreadable)."""
    try:
        with open("/proc/{}/environ".format(pid), "rb") as fh:
            return "{}={}".format(RUN_ID_VAR, run_id).encode() in fh.read().split(b"\0")
    except OSError:
        return False


def leftovers(apps: Sequence[GpuApp], run_id: str, worker_pgid: Optional[int]) -> List[GpuApp]:
    """The processes holding GPU memory that are the run's: in the worker's process group, or started by
    the run (RUN_ID_VAR in their environment). Another account's or another run's are never among them."""
    ours = []
    for app in apps:
        try:
            in_group = worker_pgid is not None and os.getpgid(app.pid) == worker_pgid
        except OSError:
            continue  # gone already
        if in_group or _environ_names_run(app.pid, run_id):
            ours.append(app)
    return ours


def stop_leftovers(run_id: str, worker_pgid: Optional[int], log: Log) -> List[str]:
    """The leak guard: what of the run still holds GPU memory after its worker ended is killed. The lines
    (one per process: pid, memory, whether it went) are for run.log."""
    if shutil.which("nvidia-smi") is None:
        return []
    found = leftovers(parse_apps(smi(APPS_QUERY) or ""), run_id, worker_pgid)
    lines = []
    for app in found:
        try:
            os.kill(app.pid, signal.SIGKILL)
        except OSError:
            continue
        gone = _wait_gone(app.pid, LEFTOVER_WAIT_S)
        memory = "an unknown amount of" if app.used_mb is None else "{:.0f} MB of".format(app.used_mb)
        lines.append(
            "leak guard: process {} of the run still held {} GPU memory after the run ended: {}".format(
                app.pid, memory, "killed" if gone else "sent SIGKILL, still there after {:g} s".format(LEFTOVER_WAIT_S)
            )
        )
    for line in lines:
        log(line)
    return lines


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entry = read_process(pid)
        if entry is None or entry.state == "Z":
            return True  # gone, or a zombie, which holds no memory (its parent, not us, reaps it)
        time.sleep(0.02)
    return False
