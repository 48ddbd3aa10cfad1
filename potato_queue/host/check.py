"""What `training check` asks an ssh host or a login node: `python -c <this source>` prints one JSON object.

Standard library only, Python 3.8+, self-contained (nothing of ours is needed
on the host). From stdin, one JSON line: the backend's `env` (its PATH finds
nvidia-smi; a command line is anyone's to read), the nvidia-smi query and the
packages to look for (and, for a login node, `slurm`: remote_dir, job_python,
partition; `socket`: the forward a run would ask for, whose file it removes). Out: the interpreter, which packages import, and nvidia-smi's
answer with the arch list of the host's torch, or, on a login node, SLURM's
commands on PATH and sinfo's nodes. The server decides from these
with potato_queue.host.gpus, as a run would; a run's bootstrap asks the same
through gpu_facts().
"""

import json
import os
import platform
import shutil
import socket
import stat
import subprocess
import sys
from importlib.util import find_spec
from typing import Any, Dict, List, Optional, Tuple

# What a trainer needs, looked for by `training check` on every kind of host.
TRAINING_PACKAGES = ["torch", "transformers", "peft", "sklearn"]


def nvidia_smi(query: List[str]) -> str:
    """nvidia-smi's CSV answer to `query`; "" when there is no nvidia-smi (no GPU) or it said nothing."""
    if shutil.which("nvidia-smi") is None:
        return ""
    return subprocess.run(query, stdout=subprocess.PIPE, check=False).stdout.decode(
        errors="replace"
    )  # its errors: ours


def gpu_facts(python: str, query: List[str]) -> Tuple[str, Optional[List[str]]]:
    """(nvidia-smi's CSV, the arch list of `python`'s torch or None); no nvidia-smi means no GPU.
    torch is asked in a subprocess, which sees the backend's PYTHONPATH too."""
    csv = nvidia_smi(query)
    if not csv:
        return "", None
    ask = "import json, torch; print(json.dumps(torch.cuda.get_arch_list()))"
    torch = subprocess.run([python, "-c", ask], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False)
    return csv, json.loads(torch.stdout.decode()) if torch.returncode == 0 else None


def find_model_config(model_name: str, hf_home: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The model's config.json on this machine: a local folder, or the newest snapshot in the Hugging Face
    cache; None when neither has it (nothing is downloaded)."""
    candidates = [os.path.join(os.path.expanduser(model_name), "config.json")]
    if "/" in model_name and not model_name.startswith((".", "/", "~")):
        home = hf_home or os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
        snapshots = os.path.join(home, "hub", "models--" + model_name.replace("/", "--"), "snapshots")
        try:
            names = sorted(os.listdir(snapshots), key=lambda n: os.path.getmtime(os.path.join(snapshots, n)))
        except OSError:
            names = []
        candidates += [os.path.join(snapshots, name, "config.json") for name in reversed(names)]
    for path in candidates:
        try:
            with open(path, encoding="utf-8") as fh:
                found = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(found, dict):
            return found
    return None


SINFO_FIELDS = "NodeList:|,Partition:|,StateLong:|,Gres:|,GresUsed:|"


def slurm_facts(asked: Dict[str, Any]) -> Dict[str, Any]:
    """A login node: SLURM's commands on PATH, where remote_dir really is, job_python, and sinfo's nodes."""
    tools = {name: shutil.which(name) for name in ("sbatch", "squeue", "scancel", "scontrol", "sinfo")}
    remote_dir = os.path.realpath(os.path.expanduser(asked["remote_dir"]))
    facts = {
        "tools": tools,
        "remote_dir": remote_dir,
        "remote_dir_exists": os.path.isdir(remote_dir),
        "job_python": shutil.which(asked["job_python"]),
        "sinfo": None,
        "sinfo_error": None,
    }
    if tools["sinfo"]:
        argv = ["sinfo", "-h", "-N", "-O", SINFO_FIELDS] + (
            ["-p", asked["partition"]] if asked.get("partition") else []
        )
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False, timeout=60)
        facts["sinfo"] = done.stdout.decode(errors="replace")
        facts["sinfo_error"] = done.stderr.decode(errors="replace").strip() or None
    return facts


def remove_socket(path: str) -> None:
    """A session's forwarded socket (the check's; the agent's, which imports it): sshd leaves the file. Only a
    socket of this account's. As host/boot.py's: this file is sent as a script that must stand alone."""
    try:
        info = os.lstat(path)
        if stat.S_ISSOCK(info.st_mode) and info.st_uid == os.getuid():
            os.unlink(path)
    except OSError:
        pass


def main() -> int:
    asked = json.loads(sys.stdin.readline())
    remove_socket(asked.get("socket") or "")
    os.environ.update(asked["env"])
    facts = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "hostname": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "packages": {name: find_spec(name) is not None for name in asked["packages"]},
    }  # type: Dict[str, Any]
    if asked.get("slurm"):
        facts["slurm"] = slurm_facts(asked["slurm"])  # a login node: its GPUs, if any, are not the jobs'
    else:
        csv, facts["arch_list"] = gpu_facts(sys.executable, asked["query"])
        facts["nvidia_smi"] = csv or None
    if asked.get("model"):  # training check --llm: the model's config.json, where this host has it
        facts["model_config"] = find_model_config(asked["model"])
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
