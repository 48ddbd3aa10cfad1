"""What `training check` asks an ssh host: `python -c <this source>` prints one JSON object.

Standard library only, Python 3.8+, self-contained (nothing of ours is needed
on the host). From stdin, one JSON line: the backend's `env` (its PATH finds
nvidia-smi; a command line is anyone's to read), the nvidia-smi query and the
packages to look for. Out: the interpreter, nvidia-smi's answer, the arch list
of the host's torch and which packages import. The server decides from these
with potato_queue.agent.gpus, as a run would; a run's bootstrap asks the same
through gpu_facts().
"""

import json
import os
import platform
import shutil
import subprocess
import sys
from importlib.util import find_spec
from typing import List, Optional, Tuple


def gpu_facts(python: str, query: List[str]) -> Tuple[str, Optional[List[str]]]:
    """(nvidia-smi's CSV, the arch list of `python`'s torch or None); no nvidia-smi means no GPU.
    torch is asked in a subprocess, which sees the backend's PYTHONPATH too."""
    if shutil.which("nvidia-smi") is None:
        return "", None
    csv = subprocess.run(query, stdout=subprocess.PIPE, check=False).stdout.decode(errors="replace")  # its errors: ours
    if not csv:
        return "", None
    ask = "import json, torch; print(json.dumps(torch.cuda.get_arch_list()))"
    torch = subprocess.run([python, "-c", ask], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False)
    return csv, json.loads(torch.stdout.decode()) if torch.returncode == 0 else None


def main() -> int:
    asked = json.loads(sys.stdin.readline())
    os.environ.update(asked["env"])
    csv, archs = gpu_facts(sys.executable, asked["query"])
    facts = {"python": platform.python_version(), "executable": sys.executable, "nvidia_smi": csv or None,
             "arch_list": archs, "packages": {name: find_spec(name) is not None for name in asked["packages"]}}
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
