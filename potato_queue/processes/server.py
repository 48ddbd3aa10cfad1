"""The server: uvicorn serving create_app's app on a socket bound here."""

from __future__ import annotations

import gc
import socket
import threading
import time
from typing import Any

from potato_queue.config import ProjectConfig
from potato_queue.processes.startup import check_admin_key, check_writable
from potato_queue.server.connections import ConnectionGate, guarded_protocol, raise_file_limit
from potato_queue.settings import BODY_IDLE_S, HEADER_TIMEOUT_S

__all__ = [
    "serve_forever",
    "listening_socket",
    "collect_on_schedule",
    "YOUNG_COLLECTION_EVERY_S",
    "FULL_COLLECTION_EVERY_S",
]

# Python's own collector is lumpy under steady churn: a generation is collected when allocations outnumber
# deallocations by its threshold, so while thousands of idle claims are replaced one for one, nothing is collected
# and every new claim's objects pile up in the young generation. The next burst (a run starting) then walks all of
# them, and the old generation's 700,000 objects after them: the claim that takes the run waited 1.3 s (P7, 10,000
# agents). So the server collects the young generations every YOUNG_COLLECTION_EVERY_S (a few ms each) and the
# whole heap every FULL_COLLECTION_EVERY_S (half a second at 10,000 agents); Python itself still collects the young
# ones under a burst, but never starts a full pass.
YOUNG_COLLECTION_EVERY_S = 1.0
FULL_COLLECTION_EVERY_S = 300.0


def collect_on_schedule(young_every_s: float, full_every_s: float) -> threading.Event:
    """The collection schedule above, in a daemon thread until the event returned is set. What exists now (the
    app, its routes and models) lives as long as the process: no pass walks it again."""
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 2**31 - 1)
    stop = threading.Event()

    def collect() -> None:
        last_full_s = time.monotonic()
        while not stop.wait(young_every_s):
            full = time.monotonic() - last_full_s >= full_every_s
            gc.collect(2 if full else 1)
            last_full_s = time.monotonic() if full else last_full_s

    threading.Thread(target=collect, daemon=True, name="collector").start()
    return stop


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound and listening (port 0: one the system picks)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit this; without it every small reply waits on a 40 ms delayed ACK.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections wait in the backlog until uvicorn accepts them
    return sock


def serve_forever(
    config: ProjectConfig,
    redis_url: str,
    *,
    host: str,
    port: int,
    public_url: str | None,
    tls: tuple[str, str] | None = None,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    body_idle_s: float = BODY_IDLE_S,
) -> None:
    """Serve until stopped; `tls` (certificate file, key file) serves https; a connection whose request headers
    are not whole within header_timeout_s, or whose body stalls body_idle_s, is cut (server/connections.py)."""
    import uvicorn

    from potato_queue.insight.potato_order import clear_staging
    from potato_queue.processes.queue import enqueue, make_celery
    from potato_queue.server.app import create_app, record_server_url

    check_writable(config)
    admin_state = check_admin_key(config, host)
    clear_staging(config)  # what a server killed while it wrote the order left behind

    celery = make_celery(config, redis_url)
    app = create_app(config, redis_url, enqueue=lambda run_id: enqueue(celery, config, run_id))
    sock = listening_socket(host, port)
    bound_port = sock.getsockname()[1]
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else f"[{host}]" if ":" in host else host
    local_url = f"{'https' if tls else 'http'}://{reach}:{bound_port}"
    url = public_url or local_url
    record_server_url(app.state.store, url, local_url)
    threading.Thread(target=_tally_finished_runs, args=(app,), name="metrics-tally", daemon=True).start()
    print(f"potato-queue: serving {config.annotation_task_name or config.config_path} at {url}", flush=True)
    if url != local_url:  # behind a proxy: the executors on this machine come in by the bound address
        print(f"potato-queue: executors on this machine (and ssh forwards) reach it at {local_url}", flush=True)
    print(f"potato-queue: {admin_state}", flush=True)
    certfile, keyfile = tls or (None, None)
    files = raise_file_limit(lambda text: print(f"potato-queue: {text}", flush=True))
    protocol = guarded_protocol(ConnectionGate.for_file_limit(files), header_timeout_s, body_idle_s)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
            ssl_certfile=certfile,
            ssl_keyfile=keyfile,
            http=protocol,
        )
    )
    handle_exit = server.handle_exit

    def stopping(sig: int, frame: Any) -> None:
        app.state.stopping.set()  # the Training page's event streams end, so the shutdown need not wait on them
        app.state.claim_wakeups.stop()  # and so do the agents' long-polls (their control polls see `stopping`)
        handle_exit(sig, frame)

    server.handle_exit = stopping  # type: ignore[method-assign]
    collect_on_schedule(YOUNG_COLLECTION_EVERY_S, FULL_COLLECTION_EVERY_S)
    server.run(sockets=[sock])


def _tally_finished_runs(app: Any) -> None:
    """/metrics' tally of the finished runs, at the server's start, in the background, not by the first scrape:
    the index the last server kept (metrics_tally.json), or, after an upgrade, every record once."""
    try:
        app.state.finished_runs.scrape(app.state.store)
    except Exception as exc:  # noqa: BLE001 - a warm-up: the first scrape reads what is missing
        print(f"potato-queue: the runs could not be tallied for /metrics yet: {exc}", flush=True)
