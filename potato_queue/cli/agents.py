"""The server side of an agent backend for its admin: `training register` (its check is runs/check.py's).

The token is printed once, with the commands to run on the training machine
(the tutorial's text, with potato-queue's names); Redis keeps only its hash.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError

__all__ = ["agent_backend_checked", "register_text", "AGENT_PYZ_PATH"]

AGENT_PYZ_PATH = "/api/training/agent/v1/agent.pyz"


def agent_backend_checked(config: ProjectConfig, backend: str) -> None:
    mt = config.model_training
    from potato_queue.runs.service import require_backend

    require_backend(config, backend)
    kind = mt.backend_config(backend).type
    if kind != "agent":
        raise PotatoQueueError(
            f"backend {backend!r} is of type {kind}: only an agent backend has a token",
            fix="register a backend of type: agent",
        )


def register_text(backend: str, token: str, server_url: str | None, agent_sha256: str) -> str:
    """What `training register` prints: the token once, and what to run on the training machine. The download
    checks agent.pyz's sha256 (this server's code): over plain http, or through a proxy that was tampered
    with, a changed file must not run with the token."""
    url = server_url or "http://<this-server>:8000"
    start = f"potato-queue training agent --server {url} --backend {backend}"
    plain = urlsplit(url).scheme == "http" and urlsplit(url).hostname not in ("127.0.0.1", "localhost", "::1")
    return "\n".join(
        [
            f"Token for backend '{backend}' (shown once; registering again replaces it):",
            "",
            f"  {token}",
            "",
            "On the training machine, with potato-queue installed (pip install 'potato-queue[train-text]'):",
            "",
            f"  export POTATO_TRAINING_TOKEN={token}",
            f"  {start}",
            "",
            "Or with nothing but Python 3.8+ and the trainer's packages there (the server serves the agent as one file):",
            "",
            f"  curl -fsSo agent.pyz {url}{AGENT_PYZ_PATH} && echo '{agent_sha256}  agent.pyz' | sha256sum -c -",
            f"  POTATO_TRAINING_TOKEN={token} python3 agent.pyz --server {url} --backend {backend}",
            "",
            f"(agent.pyz's sha256 is {agent_sha256}; on macOS check it with `shasum -a 256 -c`.)",
            *(
                [
                    "(This server speaks plain http: the token and the runs' data cross the network in clear. Put it "
                    "behind TLS, deploy/nginx.conf, and give serve --public-url https://...)",
                    "",
                ]
                if plain
                else [""]
            ),
            "(The token goes in the environment or a file, --token-file: never on a command line, which other "
            "accounts can read.)"
            if server_url
            else "(Replace <this-server> with the address the training machine reaches this server at; the token goes "
            "in the environment or a file, --token-file, never on a command line.)",
        ]
    )
