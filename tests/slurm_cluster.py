"""A real single-node SLURM (munged, slurmctld, slurmd) for the slurm backend's tests.

Debian's slurm 22.05 and munge, configured as measured on these machines: no systemd, no
cgroups, its own munge key and socket, its own ports, state, spool, pid and log files, in a
folder the harness made (the sockets and the spool in a short one under /tmp). Two fake GPUs: gres files that are symlinks to /dev/null (slurmd hands
them out and sets CUDA_VISIBLE_DEVICES; nothing here can compute on them, which the tests say).
A second partition, `urgent`, preempts jobs of `gpu` (PREEMPTED) and of `spot`, which
are requeued (PreemptMode=REQUEUE). Clients find the cluster through
SLURM_CONF, which an ssh session does not inherit: the tests set it in the backend's `env`.
close() stops the daemons by their pid files (never by name) and waits for them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.sshd import free_port

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
NODE = "node1"
CPUS = 4  # more than this machine has (config_overrides): a run's job and a blocker fit side by side


def require_slurm() -> None:
    """Fails (never skips) where the suite cannot run SLURM: these tests are part of the suite."""
    missing = [path for path in DAEMONS if not Path(path).exists()] + [
        name for name in ("sbatch", "squeue", "scancel", "scontrol") if shutil.which(name) is None
    ]
    if missing:
        pytest.fail(
            f"the slurm backend's tests need SLURM ({', '.join(missing)} missing): "
            "apt-get install --no-install-recommends slurmctld slurmd slurm-client munge"
        )
    if os.geteuid() != 0:
        pytest.fail("the slurm backend's tests start slurmctld and slurmd: run them as root")


def _slurm_conf(root: Path, spool: Path, munge_socket: Path, cgroups: bool) -> str:
    # With cgroups (v1 here), memory is the kernel's to enforce: a job over its mem ends OUT_OF_MEMORY.
    # Without, OverMemoryKill samples every 30 s: DefMemPerCPU must hold a worker that imports torch, or
    # any run longer than 30 s is killed (a job of 1 CPU gets 1000 MB; four fit in RealMemory).
    tracking = (
        ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup", "JobAcctGatherType=jobacct_gather/cgroup"]
        if cgroups
        else [
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherParams=OverMemoryKill",
        ]
    )
    return "\n".join(
        [
            "ClusterName=pqtest",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={munge_socket}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={spool}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd.log'}",
            *tracking,
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "DefMemPerCPU=1000",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
            "KillWait=5",
            "MinJobAge=300",
            "GresTypes=gpu",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=CANCEL",
            f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory=4000 Gres=gpu:2 State=UNKNOWN",
            f"PartitionName=gpu Nodes={NODE} Default=YES MaxTime=INFINITE State=UP PriorityTier=1",
            f"PartitionName=urgent Nodes={NODE} MaxTime=INFINITE State=UP PriorityTier=10",
            # A partition whose jobs urgent's requeue rather than cancel (SIGTERM, then back in the queue).
            f"PartitionName=spot Nodes={NODE} MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=0",
            "",
        ]
    )


class SlurmCluster:
    """The cluster; `env` is what a client (and a backend's `env`) needs to reach it."""

    def __init__(self, root: Path, cgroups: bool = False) -> None:
        require_slurm()
        self.root = root
        for name in ("state", "dev"):
            (root / name).mkdir(parents=True, exist_ok=True)
        # The daemons' sockets (munge's, slurmstepd's in the spool) live in a short folder of their own: a
        # unix socket's path has at most 108 bytes, and a test's folder (pytest-xdist adds popen-gw1/) can be longer.
        self.sockets = Path(tempfile.mkdtemp(prefix="pqslurm-"))
        self.sockets.chmod(0o755)  # slurmd's job steps reach munge's socket as the job's user
        self.spool, munge = self.sockets / "spool", self.sockets / "munge"
        self.spool.mkdir()
        munge.mkdir(mode=0o755)
        self.munge_socket = munge / "munge.socket"
        self.conf = root / "slurm.conf"
        self.conf.write_text(_slurm_conf(root, self.spool, self.munge_socket, cgroups))
        if cgroups:
            (root / "cgroup.conf").write_text(
                "CgroupPlugin=cgroup/v1\nConstrainRAMSpace=yes\nConstrainSwapSpace=yes\n"
                "ConstrainDevices=no\nConstrainCores=no\n"
            )
        for index in range(2):
            os.symlink("/dev/null", root / "dev" / f"nvidia{index}")
        (root / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={root / 'dev'}/nvidia[0-1]\n")
        self.env = {"SLURM_CONF": str(self.conf)}
        self.pid_files: list[Path] = []
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        munge = self.sockets / "munge"
        self._daemon(
            "munged",
            [
                "/usr/sbin/munged",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
            munge / "munged.pid",
        )
        self._daemon("slurmctld", ["/usr/sbin/slurmctld", "-i"], self.root / "slurmctld.pid")
        self._daemon("slurmd", ["/usr/sbin/slurmd", "-N", NODE], self.root / "slurmd.pid")
        self.wait_node_state("idle")

    def _daemon(self, name: str, argv: list[str], pid_file: Path) -> None:
        env = dict(os.environ, SLURM_CONF=str(self.conf))
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{name} did not start: {done.stderr or done.stdout}")
        self.pid_files.append(pid_file)
        deadline = time.monotonic() + 10
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def conf_for_accounts(self) -> str:
        """slurm.conf where every account can read it, as a login node's /etc/slurm: the daemons' own copy
        is in the test's folder, which only root can enter. Clients need nothing else of the cluster's."""
        public = self.sockets / "etc"
        public.mkdir(mode=0o755, exist_ok=True)
        copy = public / "slurm.conf"
        shutil.copy(self.conf, copy)
        copy.chmod(0o644)
        return str(copy)

    def slurmd_pid(self) -> int:
        return int((self.root / "slurmd.pid").read_text().strip())

    def restart_slurmd(self) -> None:
        """slurmd again after it died (as systemd would): it finds the job steps that lived on."""
        self.pid_files.remove(self.root / "slurmd.pid")
        (self.root / "slurmd.pid").unlink(missing_ok=True)
        self._daemon("slurmd", ["/usr/sbin/slurmd", "-N", NODE], self.root / "slurmd.pid")

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A SLURM client command against this cluster, in its folder (a job's default slurm-N.out lands there)."""
        return subprocess.run(
            list(argv),
            env=dict(os.environ, **self.env),
            capture_output=True,
            text=True,
            timeout=30,
            check=check,
            cwd=self.root,
        )

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-n", NODE, "-o", "%T").stdout.strip()

    def wait_node_state(self, state: str, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while self.node_state().rstrip("*~#") != state:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"node {NODE} is {self.node_state()!r}, not {state}, after {timeout_s} s: "
                    f"{(self.root / 'slurmctld.log').read_text()[-2000:]}"
                )
            time.sleep(0.1)

    def queue(self) -> list[str]:
        """`<id> <state>` of every job SLURM still lists."""
        return self.run("squeue", "-h", "-o", "%i %T").stdout.split("\n")[:-1]

    def job_lines(self, job: str) -> str:
        """What slurmctld and slurmd logged about one job (for a failure's message)."""
        pattern = re.compile(rf"(JobId|job_id|job|JOB)[= ]{job}\b")
        return "".join(
            f"{name}:\n"
            + "".join(
                line
                for line in (self.root / name).read_text(errors="replace").splitlines(keepends=True)
                if pattern.search(line)
            )
            for name in ("slurmctld.log", "slurmd.log")
        )

    def wait_empty(self, timeout_s: float = 30) -> None:
        """No job left in the queue (each test leaves the node idle for the next)."""
        deadline = time.monotonic() + timeout_s
        while self.queue():
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs still in SLURM after {timeout_s} s: {self.queue()}")
            time.sleep(0.1)

    def resume_node(self) -> None:
        self.run("scontrol", "update", f"nodename={NODE}", "state=resume", check=False)
        self.wait_node_state("idle")

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """SIGTERM to every daemon at once (each takes about 2 s to exit), then wait; SIGKILL after 15 s."""
        running = []
        for pid_file in reversed(self.pid_files):
            try:
                pid = int(pid_file.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                continue
            running.append(pid)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in running):
            time.sleep(0.05)
        for pid in running:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.sockets, ignore_errors=True)
