"""A stand-in for the Hugging Face Hub: no hub is reachable from the machines the tests run on.

A threaded http.server on 127.0.0.1 speaking the part of the Hub's HTTP API that huggingface_hub's
`create_repo` and `upload_folder` use when Xet is off (HF_HUB_DISABLE_XET=1; this stand-in does not speak
Xet's storage protocol), as read from huggingface_hub 2.x's hf_api.py, _commit_api.py and lfs.py:

- POST /api/repos/create               {"name", "organization", "visibility"}: 200 {"url"}; 409 {"url"} if it
                                        exists
- POST /api/validate-yaml              README.md's front matter: 200, or 400 {"errors"} when not YAML
- POST /api/models/<id>/preupload/<rev> each file's upload mode: `lfs` for weights (*.safetensors, *.bin,
                                        *.pt, *.pkl), as the Hub's .gitattributes says, `regular` otherwise
- POST /<id>.git/info/lfs/objects/batch the LFS batch API, basic transfer: an upload href per object
- PUT  /lfs-objects/<oid>              the object's bytes (checked against its sha256)
- POST /api/models/<id>/commit/<rev>   the commit as NDJSON: a header, `file` lines (base64), `lfsFile`
                                        lines (an uploaded oid): 200 {"commitOid", "commitUrl"}

It keeps what arrives (each repo's visibility and files, each request's Authorization header) for the
tests to read, and answers 401 to a request without one of the tokens it was told to take.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml

__all__ = ["HubStandIn", "Repo"]

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pkl")


@dataclass
class Repo:
    visibility: str | None
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)


class HubStandIn:
    """The stand-in Hub on 127.0.0.1 (a port of its own), in a thread, until close()."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self.tokens = frozenset(tokens)  # the write tokens it takes
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.authorizations: list[str | None] = []
        self.unknown: list[str] = []  # requests this stand-in does not speak: a test asserts there are none
        self.lock = threading.Lock()
        self.server = _Server(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True, name="hub-standin").start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the routes: (status, JSON reply) -------------------------------------------------
    def create_repo(self, body: dict[str, Any]) -> tuple[int, Any]:
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else str(body["name"])
        with self.lock:
            if repo_id in self.repos:
                # The Hub's 409 carries the repo's url too: create_repo(exist_ok=True) reads it.
                return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
            self.repos[repo_id] = Repo(visibility=body.get("visibility"))
        return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id}

    def validate_yaml(self, body: dict[str, Any]) -> tuple[int, Any]:
        text = str(body.get("content", ""))
        if text.startswith("---\n"):
            try:
                yaml.safe_load(text.split("---\n")[1])
            except yaml.YAMLError as exc:
                return 400, {"errors": [{"message": str(exc)}]}
        return 200, {"errors": [], "warnings": []}

    def preupload(self, body: dict[str, Any]) -> tuple[int, Any]:
        files = [
            {
                "path": f["path"],
                "uploadMode": "lfs" if f["path"].endswith(LFS_SUFFIXES) else "regular",
                "shouldIgnore": False,
                "oid": None,
            }
            for f in body["files"]
        ]
        return 200, {"files": files, "commitOid": "0" * 40}

    def lfs_batch(self, body: dict[str, Any]) -> tuple[int, Any]:
        objects = [
            {
                "oid": o["oid"],
                "size": o["size"],
                "actions": {"upload": {"href": f"{self.url}/lfs-objects/{o['oid']}", "header": {}}},
            }
            for o in body["objects"]
        ]
        return 200, {"transfer": "basic", "objects": objects}

    def lfs_put(self, oid: str, data: bytes) -> tuple[int, Any]:
        if hashlib.sha256(data).hexdigest() != oid:
            return 400, {"error": "the object's bytes do not have its sha256"}
        with self.lock:
            self.lfs[oid] = data
        return 200, {}

    def commit(self, repo_id: str, data: bytes) -> tuple[int, Any]:
        lines = [json.loads(line) for line in data.splitlines() if line.strip()]
        files: dict[str, bytes] = {}
        for line in lines:
            value = line["value"]
            if line["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] == "lfsFile":
                if value["oid"] not in self.lfs:
                    return 422, {"error": f"LFS object {value['oid']} was never uploaded"}
                files[value["path"]] = self.lfs[value["oid"]]
        with self.lock:
            repo = self.repos.get(repo_id)
            if repo is None:
                return 404, {"error": "Repository not found"}
            repo.files.update(files)
            oid = hashlib.sha1(f"{repo_id}{len(repo.commits)}".encode()).hexdigest()
            repo.commits.append(oid)
        return 200, {"commitOid": oid, "commitUrl": f"{self.url}/{repo_id}/commit/{oid}", "pullRequestUrl": None}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client's kept-alive connection closed
            super().handle_error(request, client_address)


_PREUPLOAD = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/preupload/[^/?]+")
_COMMIT = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/commit/[^/?]+")
_BATCH = re.compile(r"^/(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch$")
_OBJECT = re.compile(r"^/lfs-objects/(?P<oid>[0-9a-f]{64})$")


def _handler(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> tuple[int, Any]:
            data = self._body()
            auth = self.headers.get("Authorization")
            with hub.lock:
                hub.authorizations.append(auth)
            path = self.path.split("?")[0]
            if method == "PUT" and (m := _OBJECT.match(path)):
                return hub.lfs_put(m["oid"], data)  # a storage URL: the Hub signs it, no token
            if auth is None or auth.removeprefix("Bearer ") not in hub.tokens:
                return 401, {"error": "Invalid credentials in Authorization header"}
            body = json.loads(data) if data and not _COMMIT.match(path) else {}
            if path == "/api/repos/create":
                return hub.create_repo(body)
            if path == "/api/validate-yaml":
                return hub.validate_yaml(body)
            for pattern, route in ((_PREUPLOAD, hub.preupload), (_BATCH, hub.lfs_batch)):
                if m := pattern.match(path):
                    return route(body)
            if m := _COMMIT.match(path):
                return hub.commit(m["repo"], data)
            hub.unknown.append(f"{method} {self.path}")
            return 404, {"error": f"the stand-in Hub does not speak {method} {path}"}

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self._reply(*self._route("POST"))

        def do_PUT(self) -> None:  # noqa: N802
            self._reply(*self._route("PUT"))

        def do_GET(self) -> None:  # noqa: N802
            self._reply(*self._route("GET"))

    return Handler
