"""Potato 2.12.1 itself (pip potato-annotation, the `potato` extra): its server started on 127.0.0.1 for a
test's project, and its training store read through its own functions."""

from __future__ import annotations

import http.cookiejar
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

# Potato's own keys for a test project: bound to loopback, annotators sign in with a name alone, items
# served by its model_review strategy (prelabelled items, least confident first), prelabels shown.
POTATO_KEYS: dict[str, Any] = {
    "host": "127.0.0.1",
    "require_password": False,
    "assignment_strategy": "model_review",
    "pre_annotation": {"enabled": True, "field": "predictions"},
}
START_TIMEOUT_S = 90


def add_potato_keys(config: Path, **extra: Any) -> None:
    data = yaml.safe_load(config.read_text())
    data.update(POTATO_KEYS, **extra)
    config.write_text(yaml.safe_dump(data, sort_keys=False))


def potato_view(config: Path) -> dict[str, Any]:
    """Potato's own config dict for the project, as its server builds it (its store reads task_dir and the
    project's name)."""
    from potato_queue.store.potato_ledger import potato_config
    from potato_queue.validate import load_checked

    return potato_config(load_checked(config))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PotatoServer:
    """`potato start CONFIG -p PORT` in the project's folder, stopped (with its process group) after."""

    def __init__(self, config: Path, logs: Path, admin_key: str, env: dict[str, str] | None = None) -> None:
        self.config, self.logs, self.admin_key, self.env = config, logs, admin_key, env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.url = ""

    @property
    def log_path(self) -> Path:
        return self.logs / f"potato{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        potato = Path(sys.executable).parent / "potato"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(potato), "start", str(self.config), "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.config.parent,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"potato exited: {self.log()[-3000:]}"
            try:
                with urllib.request.urlopen(self.url + "/", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise AssertionError(f"potato did not answer in {START_TIMEOUT_S} s: {self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def restored(self) -> int:
        """N of Potato's "Restored N model prediction(s)" line at this start (0 when it said none)."""
        found = re.findall(r"Restored (\d+) model prediction\(s\) from earlier training runs", self.log())
        return int(found[-1]) if found else 0

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("X-API-Key", self.admin_key)
        req.add_header("Content-Type", "application/json")
        req.add_header("Origin", self.url)  # Potato's same-origin check on changes
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:
                return err.code, raw.decode(errors="replace")

    def wait_run(self, run_id: str, states: set[str], timeout_s: float = 120) -> dict[str, Any]:
        """A run of Potato's own manager, once in one of `states` (success, error, cancelled)."""
        deadline = time.monotonic() + timeout_s
        run: Any = None
        while time.monotonic() < deadline:
            status, run = self.api("GET", f"/admin/training/api/runs/{run_id}")
            if status == 200 and run["status"] in states:
                return run
            time.sleep(0.2)
        raise AssertionError(f"Potato's run {run_id} not in {states} after {timeout_s} s: {run}; {self.log()[-3000:]}")

    def first_page_of(self, annotator: str) -> str:
        """The annotation page a new annotator is served first (signed in by name alone)."""
        return PotatoAnnotator(self.url, annotator).page()


class PotatoAnnotator:
    """One annotator signed in to a running Potato by name alone: the item it serves, and labelling it."""

    ITEM = re.compile(r'id="instance_id" name="instance_id" type="hidden" value="([^"]+)"')

    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        form = f"action=login&email={name}".encode()
        self.opener.open(urllib.request.Request(url + "/auth", data=form, method="POST"), timeout=30).read()

    def page(self) -> str:
        """The annotation page Potato serves now."""
        with self.opener.open(self.url + "/annotate", timeout=30) as resp:
            return resp.read().decode()

    def served(self) -> str | None:
        """The item of the annotation page Potato serves now."""
        found = self.ITEM.search(self.page())
        return found.group(1) if found else None

    def _post(self, path: str, body: dict[str, Any]) -> int:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        req.add_header("Origin", self.url)
        with self.opener.open(req, timeout=30) as resp:
            resp.read()
            return int(resp.status)

    def label_and_go_on(self, instance_id: str, annotations: dict[str, str]) -> None:
        assert self._post("/updateinstance", {"instance_id": instance_id, "annotations": annotations}) == 200
        self._post("/annotate", {"action": "next_instance"})

    def first_items(self, n: int, annotations: dict[str, str]) -> list[str]:
        """The first `n` items Potato serves, each labelled before the next."""
        seen = []
        for _ in range(n):
            item = self.served()
            assert item is not None
            seen.append(item)
            self.label_and_go_on(item, annotations)
        return seen


class Recorder:
    """A loopback http server answering every request with `status` and `body`, recording the paths."""

    def __init__(self, answers: dict[tuple[str, str], tuple[int, bytes]] | None = None) -> None:
        self.got: list[tuple[str, str]] = []
        got, answers = self.got, answers or {}

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                got.append((self.command, self.path))
                status, body = answers.get((self.command, self.path), (200, b"{}"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
