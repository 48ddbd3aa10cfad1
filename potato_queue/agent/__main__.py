"""python -m potato_queue.agent run --server URL --run-id ID --workdir DIR [--python EXE] [--keep]
python -m potato_queue.agent serve --server URL --backend NAME [--token-file F] [--once] ...

`serve` is the agent of an agent backend (`potato-queue training agent`, and
agent.pyz as the server serves it): it claims the backend's runs until
stopped. Its backend token comes from POTATO_TRAINING_TOKEN or --token-file.

With --assignment-on-stdin the agent is started ahead of time (the local
backend keeps one warm, so a run does not wait for Python to start and import
the agent): the first line of stdin is then a JSON object {run_id, server,
workdir, log} and the token is the line after it.

The run token is the first line of stdin: never an argument, an environment
variable or a log line, where other accounts (ps, /proc) or logs could read it.
Whoever starts the agent keeps stdin open: its end (the executor died, the
ssh session dropped) stops the worker like a cancel, unless --ignore-stdin-eof.
Standard library only, Python 3.8+.
"""

import argparse
import json
import os
import shutil
import signal
import sys
import threading
from typing import IO, List, Optional

from potato_queue.agent.backend import BackendAgent
from potato_queue.agent.client import RunClient
from potato_queue.agent.drain import PidFile, drain_main, drain_on_sigusr1
from potato_queue.agent.launchers.process import ProcessLauncher, worker_env
from potato_queue.agent.launchers.slurm import SlurmLauncher
from potato_queue.agent.runner import Runner, log_line
from potato_queue.agent.transport import Transport, call_timeout_s
from potato_queue.host.check import remove_socket
from potato_queue.wire.exit_codes import EXIT_BAD_SPEC
from potato_queue.wire.isolated import PASSED_NAMES_VAR, passed_names
from potato_queue.wire.sbatch import SettingsError, SlurmSettings

__all__ = ["build_parser", "read_token", "main", "serve_main", "exit_now"]


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand, `run`."""
    parser = argparse.ArgumentParser(
        prog="python -m potato_queue.agent", description="Run one potato-queue training job next to the trainer."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the job of one run (the token is read from stdin)")
    run.add_argument("--server", help="http://host:port or unix:///path/to.sock")
    run.add_argument("--run-id")
    run.add_argument("--workdir", help="folder for DIR/<run_id>/ (bundle, spec.json, work/)")
    run.add_argument(
        "--assignment-on-stdin",
        action="store_true",
        help="wait for {run_id, server, workdir, log} as a JSON line on stdin, then the token",
    )
    run.add_argument("--python", default=sys.executable, help="the interpreter that runs the worker")
    run.add_argument("--keep", action="store_true", help="keep the bundle after the run")
    run.add_argument(
        "--slurm",
        action="store_true",
        help="submit the worker with sbatch; the slurm settings come in the assignment's `slurm`",
    )
    run.add_argument(
        "--ignore-stdin-eof",
        action="store_true",
        help="keep running when stdin closes after the token (a token from a file or echo); "
        "by default a closed stdin means whoever started the agent is gone, and the worker stops",
    )
    run.add_argument(
        "--prestart-worker",
        action="store_true",
        help="start the worker's interpreter at once, while the job and the bundle download (its imports "
        "then cost the run nothing); a ray run's entry asks for it",
    )
    # Seconds without an answer before the agent stops the worker (AGT-7); tests shorten it.
    run.add_argument("--unreachable-s", type=float, default=300.0, help=argparse.SUPPRESS)
    # Started over ssh: the session's forwarded socket, a file sshd leaves behind; removed when the agent ends.
    run.add_argument("--forwarded-socket", default=None, help=argparse.SUPPRESS)
    add_serve_options(
        commands.add_parser("serve", help="claim and run an agent backend's runs until stopped", formatter_class=_wide)
    )
    return parser


def _wide(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, max_help_position=32, width=110)


def serve_main(argv: List[str], prog: str) -> int:
    """`serve` with a command line of its own (`potato-queue training agent`, agent.pyz)."""
    os.umask(0o077)
    if "--drain" in argv:
        return drain_main(argv, prog, DEFAULT_WORKDIR)
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=_wide, description="Claim and run an agent backend's runs until stopped."
    )
    add_serve_options(parser)
    return serve(parser.parse_args(argv))


TOKEN_ENV = "POTATO_TRAINING_TOKEN"
DEFAULT_WORKDIR = os.path.join("~", ".cache", "potato-training")


def add_serve_options(serve: argparse.ArgumentParser) -> None:
    """The options of `serve` (also `potato-queue training agent`'s)."""
    serve.add_argument("--server", required=True, metavar="URL", help="the server's URL, http(s)://host:port")
    serve.add_argument("--backend", required=True, metavar="NAME", help="the agent backend whose runs this agent takes")
    serve.add_argument(
        "--token-file", metavar="FILE", help="a file holding the backend token (else ${})".format(TOKEN_ENV)
    )
    serve.add_argument(
        "--python",
        default=sys.executable,
        metavar="EXE",
        help="the interpreter that runs the worker (default: this one)",
    )
    serve.add_argument("--once", action="store_true", help="exit after one run, with its exit code")
    serve.add_argument(
        "--drain",
        action="store_true",
        help="tell the agent serving from --workdir to drain (SIGUSR1): it finishes its run, claims no new "
        "one, then exits 0; this command then needs only --workdir",
    )
    serve.add_argument(
        "--workdir",
        default=DEFAULT_WORKDIR,
        metavar="DIR",
        help="where runs keep their files and model files (default ~/.cache/potato-training)",
    )
    serve.add_argument("--keep", action="store_true", help="keep each run's bundle after the run")
    serve.add_argument(
        "--ca-file", metavar="FILE", help="verify the server's https certificate against this CA file only"
    )
    serve.add_argument(
        "--pass-env",
        action="append",
        default=[],
        metavar="NAME",
        help="hand this variable of the agent's environment to the trainer although its name looks "
        "like a secret (HF_TOKEN); repeatable. Other such names never reach a trainer",
    )
    serve.add_argument(
        "--slurm-config",
        metavar="FILE",
        help="submit each run's worker with sbatch, with the slurm settings in FILE (a JSON object of "
        "the backend's keys: partition, gres, time, job_python, prelude...); --workdir must then "
        "be on storage the compute nodes share",
    )
    serve.add_argument(
        "--min-free-gpu-mb",
        type=float,
        default=0.0,
        metavar="MB",
        help="claim a run only while a GPU of this machine (those CUDA_VISIBLE_DEVICES allows) has this "
        "much memory free; meanwhile wait, and say so on the run's step line (default 0: no wait)",
    )
    # Seconds without an answer during a run before the agent cancels it (AGT-7: 300); for tests.
    serve.add_argument("--unreachable-s", type=float, default=300.0, help=argparse.SUPPRESS)


def backend_token(token_file: Optional[str]) -> str:
    """The backend token: from --token-file, else $POTATO_TRAINING_TOKEN; never from the command line."""
    if token_file:
        with open(token_file, encoding="utf-8") as fh:
            return fh.readline().strip()
    return os.environ.get(TOKEN_ENV, "").strip()


def serve(args: argparse.Namespace) -> int:
    """Run an agent backend's agent until SIGINT/SIGTERM (a run in flight is cancelled and reported)."""
    try:
        token = backend_token(args.token_file)
    except OSError as exc:
        log_line("the token file cannot be read: {}".format(exc))
        return EXIT_BAD_SPEC
    if not token:
        log_line(
            "no backend token: set {} or pass --token-file (the token `potato-queue training register {} "
            "CONFIG` printed on the server)".format(TOKEN_ENV, args.backend)
        )
        return EXIT_BAD_SPEC
    if args.pass_env:  # every later allowed_env (the worker's, sbatch's) hands them on
        os.environ[PASSED_NAMES_VAR] = ",".join(sorted(passed_names(os.environ) | set(args.pass_env)))
    workdir = os.path.expanduser(args.workdir)
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    try:
        settings = read_slurm_config(args.slurm_config) if args.slurm_config else None
        factory = None if settings is None else (lambda: SlurmLauncher(settings, log_line))
        agent = BackendAgent(
            args.server,
            args.backend,
            token,
            workdir,
            python=args.python,
            keep=args.keep,
            once=args.once,
            unreachable_s=args.unreachable_s,
            ca_file=args.ca_file,
            log=log_line,
            launcher_factory=factory,
            min_free_gpu_mb=args.min_free_gpu_mb,
        )
    except (ValueError, OSError) as exc:
        log_line(str(exc))
        return EXIT_BAD_SPEC
    gpu_problem = agent.gpu_problem()
    if settings is not None and args.min_free_gpu_mb > 0:  # this machine's GPUs are not the job's
        gpu_problem = (
            "--min-free-gpu-mb looks at this machine's GPUs, but with --slurm-config each run's worker "
            "runs on a node SLURM picks; fix: leave --min-free-gpu-mb out (gres asks SLURM for the GPU)"
        )
    if gpu_problem is not None:
        log_line(gpu_problem)
        return EXIT_BAD_SPEC

    return _serve_until_signalled(agent, workdir)


def _serve_until_signalled(agent: BackendAgent, workdir: str) -> int:
    """agent.serve(): SIGTERM, SIGINT and SIGHUP stop it (cancelling a run in flight), SIGUSR1 drains it; its
    pid file in `workdir`, locked while it serves, is how `--drain` finds it and proves it is this agent."""

    def handler(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if agent.runner is None:
            raise SystemExit(0)  # idle: leave the claim that is waiting; nothing to cancel
        agent.stop("the agent got {}".format(name))

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, handler)
    drain_on_sigusr1(agent)
    pid_file = PidFile(workdir, log_line)
    pid_file.hold(agent.backend)  # False: another agent holds it; this one serves on (it said how to drain it)
    try:
        return agent.serve()
    finally:
        pid_file.release()


def read_slurm_config(path: str) -> SlurmSettings:
    """--slurm-config's settings; ValueError (SettingsError) with what is wrong in the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except ValueError as exc:
        raise SettingsError("{} is not valid JSON: {}".format(path, exc)) from exc
    try:
        return SlurmSettings.of(data)
    except SettingsError as exc:
        raise SettingsError("{}: {}".format(path, exc)) from exc


def read_assignment(args: argparse.Namespace, stream: IO[str]) -> bool:
    """Fill in the run from stdin's JSON line and send our output to its log; False at EOF."""
    line = stream.readline()
    if not line.strip():
        return False  # whoever kept us warm is gone: nothing to do
    assignment = json.loads(line)
    args.run_id, args.server, args.workdir = assignment["run_id"], assignment["server"], assignment["workdir"]
    args.slurm_settings = assignment.get("slurm") or {}
    args.host = assignment.get("host")  # the name the admin gave this host (errors use it)
    args.keep = bool(assignment.get("keep", args.keep))
    # A local run's agent works in its run's folder: the executor names a folder the runs share for checkpoints.
    args.checkpoints = assignment.get("checkpoints")
    if assignment.get("log"):
        fd = os.open(assignment["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    return True


def read_token(stream: IO[str]) -> str:
    """The first line of stdin, stripped ('' when there is none)."""
    return stream.readline().strip()


STDIN_CLOSED = "stdin closed: whoever started the agent is gone"


def _watch_stdin(stream: IO[str], runner: Runner) -> None:
    """Stop the worker when stdin reaches EOF: the executor (or the ssh session) that started us is gone."""

    def watch() -> None:
        while stream.readline():
            pass  # nothing more is expected on stdin; only its end matters
        runner.starter_gone(STDIN_CLOSED)

    threading.Thread(target=watch, name="stdin", daemon=True).start()


def _stop_on_signals(runner: Runner) -> None:
    """SIGTERM, SIGINT and SIGHUP (the ssh session dropped) stop the worker the way a cancel does."""

    def handler(signum: int, _frame: object) -> None:
        runner.request_stop("the agent got {}".format(signal.Signals(signum).name))

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, handler)


def main(argv: Optional[List[str]] = None) -> int:
    """Read the token, run the job, return the exit code to report."""
    os.umask(0o077)  # files 0600, folders 0700: the host is shared with other accounts
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args)
    try:
        return _run(parser, args)
    finally:
        if args.forwarded_socket:  # an executor that died would leave it in the host's /tmp
            remove_socket(args.forwarded_socket)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`run`: one job, from its assignment (or the command line) to its reported end."""
    launcher = ProcessLauncher(args.python, worker_env())  # type: WorkerLauncher
    if args.prestart_worker and not args.assignment_on_stdin:
        launcher.prestart()
    if args.assignment_on_stdin:
        if not args.slurm:
            # Start the worker's interpreter now too: a warm agent with a cold worker saves half.
            launcher.prestart()
        if not read_assignment(args, sys.stdin):
            launcher.close()
            return 0
        if args.slurm:
            try:
                launcher = SlurmLauncher(SlurmSettings.of(args.slurm_settings), log_line, host=args.host)
            except SettingsError as exc:
                log_line(str(exc))
                return EXIT_BAD_SPEC
    if not (args.server and args.run_id and args.workdir):
        launcher.close()
        parser.error("run needs --server, --run-id and --workdir (or --assignment-on-stdin)")
    token = read_token(sys.stdin)
    if not token:
        log_line("no run token: the first line of stdin must hold it")
        launcher.close()
        return EXIT_BAD_SPEC
    try:
        client = RunClient(Transport(args.server, token, call_timeout_s(args.unreachable_s), log=log_line), args.run_id)
        runner = Runner(
            client,
            args.workdir,
            launcher,
            keep=args.keep,
            unreachable_s=args.unreachable_s,
            checkpoints=getattr(args, "checkpoints", None),
        )
    except ValueError as exc:
        log_line(str(exc))
        launcher.close()
        return EXIT_BAD_SPEC
    _stop_on_signals(runner)
    if not args.ignore_stdin_eof:
        _watch_stdin(sys.stdin, runner)
    log_line("run {}: server {}, workdir {}".format(args.run_id, args.server, runner.files.root))
    try:
        return runner.run()
    finally:
        if args.forwarded_socket and runner.stopped_for == STDIN_CLOSED and not args.keep:
            # Started over ssh, and stopped because whoever started us is gone (an executor killed mid-run):
            # nobody will collect the job folder or remove it, so it goes with us.
            shutil.rmtree(runner.files.root, ignore_errors=True)


def exit_now(code: int) -> None:
    """Leave once main has returned: the result is posted and the files are cleaned. The daemon threads
    (stdin's watcher, the heartbeat) may still block in a read, and the interpreter's teardown then waits
    30 ms or more on them, which a queued run's end waits for too (P3); nothing is left for it to do."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
