"""A Ray job's entrypoint: trade the run's code for its token, fetch the agent, become it (executors/ray.py).

Standard library only, Python 3.8+, self-contained: it runs on a Ray node where
nothing of ours is yet, as `PYTHON -I -c "<this file>" SERVER RUN_ID SHA256
WORKDIR`. Ray shows a job's command line and environment on its dashboard, so
neither holds a secret that still works once the run has started: the
environment holds the run's one-time code, spent here before anything else
happens, and the token it buys goes to the agent on a pipe (its stdin), never
on a command line or into a file. A job Ray starts after its run ended (a
cancelled run whose job Ray kept PENDING: ray issue 58353) finds its code dead
and exits 0 having done nothing. The agent zipapp is checked against the
sha256 the executor sent, then unpacked once into WORKDIR/code/<sha256>/ (0700
folders, 0600 files) and run from there: Python keeps the compiled modules
beside them, so a later run on the node does not compile the agent, worker and
trainers again (from a zip it would, every run: 0.15 s of each run's start).
"""

import hashlib
import io
import os
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
import zipfile

CODE_ENV = "POTATO_QUEUE_RUN_CODE"
API = "/api/training/agent/v1"
# The server may be restarting when the job starts: its calls are tried again this long.
REACH_S = 120.0
EXIT_NOTHING_TO_DO = 0
EXIT_UNREACHABLE = 1
UNPACKED_FROM = "unpacked-from.sha256"  # worker/environment.py's: the code's name in the run's record


def say(text):
    # type: (str) -> None
    sys.stderr.write("potato-queue: " + text + "\n")
    sys.stderr.flush()


def call(request):
    # type: (urllib.request.Request) -> bytes
    """The reply's body; an HTTPError as it is; a connection error tried again for REACH_S."""
    deadline = time.time() + REACH_S
    while True:
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return reply.read()
        except urllib.error.HTTPError:
            raise
        except (OSError, urllib.error.URLError) as exc:
            if time.time() > deadline:
                say("the server at {} does not answer from this node: {}".format(request.full_url, exc))
                sys.exit(EXIT_UNREACHABLE)
            time.sleep(2)


def redeem(server, run_id, code):
    # type: (str, str, str) -> str
    """The run's token for its one-time code."""
    import json

    url = "{}{}/runs/{}/redeem".format(server, API, run_id)
    request = urllib.request.Request(url, data=b"", method="POST", headers={"Authorization": "Bearer " + code})
    try:
        return str(json.loads(call(request).decode())["token"])
    except urllib.error.HTTPError as exc:
        if exc.code != 401:
            say("the server refused run {}'s code: HTTP {}".format(run_id, exc.code))
            sys.exit(EXIT_UNREACHABLE)
        say("run {} has ended, or its code was spent: this job has nothing to do".format(run_id))
        sys.exit(EXIT_NOTHING_TO_DO)


def fetch_agent(server, sha256, workdir):
    # type: (str, str, str) -> str
    """WORKDIR/code/<sha256>/, the agent zipapp unpacked, fetched from the server when it is not there yet."""
    folder = os.path.join(workdir, "code")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, sha256)
    if os.path.isfile(os.path.join(path, "__main__.py")):
        return path
    try:
        data = call(urllib.request.Request(server + API + "/agent.pyz"))
    except urllib.error.HTTPError as exc:
        say("the server at {} did not give the agent: HTTP {}".format(server, exc.code))
        sys.exit(EXIT_UNREACHABLE)
    if hashlib.sha256(data).hexdigest() != sha256:
        say("the agent {} serves is not this run's code (sha256 differs): was the server upgraded?".format(server))
        sys.exit(EXIT_UNREACHABLE)
    partial = "{}.{}.partial".format(path, os.getpid())
    shutil.rmtree(path, ignore_errors=True)  # not an agent (no __main__.py): whatever it is, it goes
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            archive.extractall(partial)  # our own archive, its sha256 checked: no name climbs out
        with open(os.path.join(partial, UNPACKED_FROM), "w") as fh:
            fh.write(sha256 + "\n")
        os.rename(partial, path)  # whole or absent
    except OSError:
        if not os.path.isfile(os.path.join(path, "__main__.py")):
            raise
        shutil.rmtree(partial, ignore_errors=True)  # another job on the node unpacked it first
    return path


def main(argv):
    # type: (list) -> None
    server, run_id, sha256, workdir = argv[0].rstrip("/"), argv[1], argv[2], argv[3]
    os.umask(0o077)
    code = os.environ.pop(CODE_ENV, "")
    token = redeem(server, run_id, code)
    workdir = os.path.expanduser(workdir)
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    say("run {} on {}: GPUs {} (CUDA_VISIBLE_DEVICES)".format(run_id, socket.gethostname(), gpus or "none"))
    agent = fetch_agent(server, sha256, workdir)
    read_end, write_end = os.pipe()
    os.write(write_end, (token + "\n").encode())
    os.close(write_end)
    os.dup2(read_end, 0)
    os.close(read_end)
    command = [sys.executable, "-I", agent, "run", "--server", server, "--run-id", run_id, "--workdir", workdir]
    os.execv(sys.executable, command + ["--ignore-stdin-eof", "--prestart-worker"])


if __name__ == "__main__":
    main(sys.argv[1:])
