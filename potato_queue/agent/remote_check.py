"""What `training check` asks an ssh host: `python -c <this source>` prints one JSON object.

Standard library only, Python 3.8+, self-contained (nothing of ours is needed
on the host): the interpreter (run with the backend's env, sent on stdin), nvidia-smi's answer, the arch list of the
host's torch, and which training packages the interpreter can import. The
server decides from these with potato_queue.agent.gpus, as a run would.
"""

import json
import os
import platform
import shutil
import subprocess
import sys
from importlib.util import find_spec

QUERY = ["nvidia-smi", "--query-gpu=index,name,memory.free,memory.total,utilization.gpu,compute_cap",
         "--format=csv,noheader,nounits"]
PACKAGES = ("torch", "transformers", "peft", "sklearn")


def main() -> int:
    # The backend's `env` (its PATH finds nvidia-smi) comes on stdin: a command line is anyone's to read.
    line = sys.stdin.readline()
    os.environ.update(json.loads(line) if line.strip() else {})
    facts = {"python": platform.python_version(), "executable": sys.executable, "nvidia_smi": None,
             "arch_list": None, "packages": {name: find_spec(name) is not None for name in PACKAGES}}
    if shutil.which("nvidia-smi"):
        answer = subprocess.run(QUERY, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False)
        facts["nvidia_smi"] = answer.stdout.decode(errors="replace")
    if facts["nvidia_smi"]:  # asked in a subprocess, which sees the backend's PYTHONPATH too
        ask = "import json, torch; print(json.dumps(torch.cuda.get_arch_list()))"
        torch = subprocess.run([sys.executable, "-c", ask], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               check=False)
        if torch.returncode == 0:
            facts["arch_list"] = json.loads(torch.stdout.decode())
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
