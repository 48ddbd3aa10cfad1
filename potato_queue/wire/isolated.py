"""Starting our own Python code on a host shared with accounts we do not trust.

Standard library only, Python 3.8+. Two rules:

- Nothing is imported from the working directory or any folder another
  account can write. `python -m pkg` puts the working directory first on
  sys.path, and a pre-started worker waits in the temp folder, where anyone
  can drop a `json.py`. Isolated mode (-I) would also drop PYTHONPATH and
  the user's site-packages, where a student's `pip install --user torch`
  lives. So our processes start as `python -c BOOTSTRAP CODE_ROOT MODULE
  ARGS...`: the bootstrap removes the working directory ('' for -c) from
  sys.path before anything else is imported, puts the code's own folder
  first, and runs the module as __main__.
- The environment is allow-listed, one rule on every backend
  (allowed_env): the executor's secrets (the Redis URL with its password, the
  admin key, an agent's token) never reach a trainer. A backend's `env`
  reaches its agent and trainer, except names that look like secrets, which
  pass only when the backend lists them in `secret_env`.
"""

import hashlib
import os
import re
import zipfile
from typing import Dict, Iterable, List, Mapping, Optional, Set

__all__ = [
    "THREAD_ENV_VARS",
    "RUN_ID_VAR",
    "BARE_PACKAGES",
    "BOOTSTRAP",
    "CODE_ROOT",
    "python_argv",
    "allowed_env",
    "passed_env",
    "passed_names",
    "looks_secret",
    "ALLOWED_NAMES",
    "ALLOWED_PREFIXES",
    "PASSED_NAMES_VAR",
    "shared_code_root",
]

# The thread pools' sizes (the worker sets them from limits.num_threads; an agent's and a batch job's
# environment passes them): one list for every side.
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "RAYON_RS_NUM_CPUS",  # Hugging Face tokenizers
)

# The sub-packages that run on a training machine (standard library only at module level): what the ssh
# backend copies and the agent backend serves (code_package.py), and what a SLURM job imports.
BARE_PACKAGES = ("wire", "agent", "host", "worker", "trainers")

# The folder holding the potato_queue package.
CODE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BOOTSTRAP = (
    "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "sys.path.insert(0, sys.argv[1]); module = sys.argv[2]; sys.argv[:] = [module] + sys.argv[3:]; "
    "import runpy; runpy.run_module(module, run_name='__main__', alter_sys=True)"
)

# What a trainer may need: the OS basics, locale, proxies and CA files for a model hub, CUDA and its
# libraries, thread counts, Python environments, the schedulers' own variables.
ALLOWED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TERM",
        "LD_LIBRARY_PATH",
        "LIBRARY_PATH",
        "CPATH",
        "PYTHONHASHSEED",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "VIRTUAL_ENV",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "TOKENIZERS_PARALLELISM",
        "CUBLAS_WORKSPACE_CONFIG",
        *THREAD_ENV_VARS,
    }
)
ALLOWED_PREFIXES = (
    "LC_",
    "XDG_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "CUDNN_",
    "HIP_",
    "ROCR_",
    "ROCM_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TORCH_",
    "PYTORCH_",
    "CONDA_",
    "SLURM_",
    "MPLCONFIGDIR",
)
# Never passed on, whatever the prefixes say, unless a backend lists it: a token or key in a name marks a secret.
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_KEY|CREDENTIAL|PRIVATE_KEY", re.IGNORECASE)
# The names a backend passed (its `env` and `secret_env`): set for the agent, so that the trainer it starts
# gets them too, whichever process in between filters the environment again.
PASSED_NAMES_VAR = "POTATO_QUEUE_PASSED_ENV"
# Set by the worker to its run's id once it has read its spec: every process the trainer starts inherits it,
# which is how the agent's leak guard tells the run's leftovers from other accounts' and runs' processes.
RUN_ID_VAR = "POTATO_QUEUE_RUN_ID"


def passed_names(environ: Mapping[str, str]) -> Set[str]:
    """The names a backend passed before, as PASSED_NAMES_VAR carries them."""
    return set(filter(None, environ.get(PASSED_NAMES_VAR, "").split(",")))


def looks_secret(name: str) -> bool:
    return SECRET_NAME.search(name) is not None


def python_argv(
    python: str, module: str, args: List[str], code_root: str = CODE_ROOT, no_site: bool = False
) -> List[str]:
    """The command line that runs `python -m module args` without importing from the working directory."""
    return [python] + (["-S"] if no_site else []) + ["-c", BOOTSTRAP, code_root, module] + list(args)


def passed_env(extra: Optional[Mapping[str, str]], secrets: Iterable[str] = ()) -> Dict[str, str]:
    """What of a backend's `env` passes: every name but those that look like secrets, unless listed."""
    listed = set(secrets)
    return {k: v for k, v in (extra or {}).items() if k in listed or not looks_secret(k)}


def allowed_env(
    environ: Optional[Mapping[str, str]] = None, extra: Optional[Mapping[str, str]] = None, secrets: Iterable[str] = ()
) -> Dict[str, str]:
    """The environment to hand on from `environ` (default: this process's): its allow-listed names that do
    not look like secrets, the names passed before (PASSED_NAMES_VAR), a backend's `env` (`extra`, by
    passed_env's rule) and the secrets it lists by name (`secrets`, from `extra` or `environ`)."""
    source = os.environ if environ is None else environ
    extra = passed_env(extra, secrets)
    passed = passed_names(source) | set(extra) | set(secrets)
    env = {
        k: v
        for k, v in source.items()
        if k in passed or ((k in ALLOWED_NAMES or k.startswith(ALLOWED_PREFIXES)) and not looks_secret(k))
    }
    env.update(extra)
    if passed:
        env[PASSED_NAMES_VAR] = ",".join(sorted(passed))
    return env


def shared_code_root(workdir: str) -> str:
    """Where the compute nodes import our code from: the agent's zipapp, or a zip of the installed package
    in the shared workdir (an installed package lives in a folder the nodes may not have)."""
    if os.path.isfile(CODE_ROOT):
        return CODE_ROOT
    names = [os.path.join("potato_queue", "__init__.py")]
    for package in BARE_PACKAGES:
        for folder, _dirs, files in sorted(os.walk(os.path.join(CODE_ROOT, "potato_queue", package))):
            names += sorted(os.path.relpath(os.path.join(folder, f), CODE_ROOT) for f in files if f.endswith(".py"))
    digest = hashlib.sha256()
    for name in names:
        with open(os.path.join(CODE_ROOT, name), "rb") as fh:
            digest.update(name.encode() + b"\0" + fh.read())
    target = os.path.join(workdir, "code", "potato-queue-{}.pyz".format(digest.hexdigest()[:16]))
    if not os.path.exists(target):
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        partial = "{}.{}.partial".format(target, os.getpid())
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for name in names:
                archive.write(os.path.join(CODE_ROOT, name), name)
        os.replace(partial, target)
    return target
