"""The agent's two transports on an ssh host, side by side: the reverse forward against the ssh session itself.

    .venv/bin/python bench/bench_transport.py [--bundle-mb 256] [--events 500] [--upload-mb 64] [--rounds 3]

Where sshd allows it, a run's agent reaches the server through a unix socket that ssh reverse-forwards
(`-R`); where sshd refuses every forward, the bootstrap listens on that socket itself and carries the
agent's connections as frames over the session's stdin and stdout (host/channel.py's HostRelay on the
host, executors/remote/carried.py's carry here). This measures what a run sends through it, over the same
real sshd on 127.0.0.1 (tests/sshd.py), alternating which goes first:

- bundle down: one GET of `--bundle-mb` MB, as the agent downloads a run's bundle;
- events: `--events` POSTs of a 300-byte event on one kept-alive connection, as the agent relays them;
- back: one POST of `--upload-mb` MB, as the agent uploads predictions.jsonl.

The model files come back over a separate ssh of their own (copy.py) whichever the transport, so that part
is the same for both: bench_ssh.py p5 measures it against scp. The client on the host is one standard-library
script that talks HTTP/1.1 to the socket, the way the agent's transport does. Run as root (the sshd logs in
as root).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.quick import quick_args  # noqa: E402
from potato_queue.executors.remote.carried import carry  # noqa: E402
from tests.sshd import ALIAS, Sshd  # noqa: E402

BLOCK = os.urandom(1 << 20)

CLIENT = r"""
import http.client, json, socket, sys, time

class Unix(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=120)
        self.path = path
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)

path, events, upload_mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn = Unix(path)
start = time.perf_counter()
conn.request("GET", "/bundle")
reply, size = conn.getresponse(), 0
while True:
    chunk = reply.read(1 << 20)
    if not chunk:
        break
    size += len(chunk)
bundle_s = time.perf_counter() - start
event = json.dumps({"type": "progress", "step": 1, "loss": 0.5, "pad": "x" * 220}).encode()
start = time.perf_counter()
for _ in range(events):
    conn.request("POST", "/events", body=event, headers={"Content-Type": "application/json"})
    conn.getresponse().read()
events_s = time.perf_counter() - start
block = bytes(1 << 20)
start = time.perf_counter()
conn.putrequest("POST", "/upload")
conn.putheader("Content-Length", str(upload_mb << 20))
conn.endheaders()
for _ in range(upload_mb):
    conn.send(block)
conn.getresponse().read()
upload_s = time.perf_counter() - start
print(json.dumps({"bundle_bytes": size, "bundle_s": bundle_s, "events_s": events_s, "upload_s": upload_s}), flush=True)
"""

# The host's end where sshd refuses forwards: what the bootstrap's relay_agent does, with the client as the agent.
RELAY = r"""
import subprocess, sys
from potato_queue.host.channel import HostRelay

relay = HostRelay(sys.argv[1])
try:
    agent = subprocess.Popen([sys.executable] + sys.argv[2:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    sys.exit(relay.serve(agent))
finally:
    relay.close()
"""


def serve(bundle_mb: int) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # as uvicorn, the real server, sets TCP_NODELAY

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Length", str(bundle_mb << 20))
            self.end_headers()
            for _ in range(bundle_mb):
                self.wfile.write(BLOCK)

        def do_POST(self) -> None:  # noqa: N802
            left = int(self.headers["Content-Length"])
            while left:
                left -= len(self.rfile.read(min(left, 1 << 20)))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def over_forward(sshd: Sshd, port: int, tmp: Path, client_args: list[str], n: int) -> dict[str, float]:
    socket_path = f"/tmp/pq-bench-fwd-{os.getpid()}-{n}.sock"
    try:
        done = subprocess.run(
            [
                "ssh",
                "-F",
                str(sshd.config),
                "-o",
                "ExitOnForwardFailure=yes",
                "-R",
                f"{socket_path}:127.0.0.1:{port}",
                ALIAS,
                sys.executable,
                str(tmp / "client.py"),
                socket_path,
                *client_args,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
    finally:
        Path(socket_path).unlink(missing_ok=True)  # sshd leaves a forwarded socket's file
    return json.loads(done.stdout.strip().splitlines()[-1])


def over_session(sshd: Sshd, port: int, tmp: Path, client_args: list[str], n: int) -> dict[str, float]:
    socket_path = f"/tmp/pq-bench-session-{os.getpid()}-{n}.sock"
    argv = [
        "ssh",
        "-F",
        str(sshd.config),
        ALIAS,
        "env",
        f"PYTHONPATH={ROOT}",
        sys.executable,
        str(tmp / "relay.py"),
        socket_path,
        str(tmp / "client.py"),
        socket_path,
        *client_args,
    ]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    log = tmp / f"agent-{n}.log"
    with open(log, "wb") as agent_log:
        carry(proc.stdout, proc.stdin, f"http://127.0.0.1:{port}", agent_log)
    proc.stdin.close()
    if proc.wait(timeout=60) != 0:
        raise RuntimeError(f"the session ended with {proc.returncode}: {log.read_text()}")
    return json.loads(log.read_text().strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bundle-mb", type=int, default=256)
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--upload-mb", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = quick_args(parser, bundle_mb=4, events=50, upload_mb=4, rounds=1)
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as folder:
        tmp = Path(folder)
        (tmp / "client.py").write_text(CLIENT)
        (tmp / "relay.py").write_text(RELAY)
        sshd, httpd = Sshd(tmp / "sshd"), serve(args.bundle_mb)
        try:
            sshd.write_config("root")
            client_args = [str(args.events), str(args.upload_mb)]
            results: dict[str, list[dict[str, float]]] = {"forward": [], "session": []}
            for n in range(args.rounds * 2):  # alternating who goes first
                mode = ("forward", "session")[n % 2] if n // 2 % 2 == 0 else ("session", "forward")[n % 2]
                run = over_forward if mode == "forward" else over_session
                results[mode].append(run(sshd, httpd.server_port, tmp, client_args, n))
        finally:
            httpd.shutdown()
            sshd.close()
    report(results, args)


def report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    rows = [
        ("bundle down, MB/s", lambda m: args.bundle_mb / median(m, "bundle_s")),
        ("events, per s", lambda m: args.events / median(m, "events_s")),
        ("predictions back, MB/s", lambda m: args.upload_mb / median(m, "upload_s")),
    ]
    print(
        f"The agent's transports over one real sshd on 127.0.0.1, median of {args.rounds} each "
        f"({args.bundle_mb} MB down, {args.events} events, {args.upload_mb} MB back):"
    )
    print(f"{'':24} {'forward':>9} {'session':>9} {'session/forward':>16}")
    for name, rate in rows:
        forward, session = rate("forward"), rate("session")
        print(f"{name:24} {forward:>9.0f} {session:>9.0f} {session / forward:>15.2f}x")
    print("model files back: their own ssh (copy.py) in both; bench_ssh.py p5 compares it with scp", flush=True)


if __name__ == "__main__":
    main()
