"""What the server and an executor check before they start: the project's runs can be written, and the
admin key is no placeholder on a reachable address."""

from __future__ import annotations

import tempfile

from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError

__all__ = ["check_admin_key", "check_writable"]


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")


def check_admin_key(config: ProjectConfig, host: str) -> str:
    """What the admin API will accept, said at start: refuse a guessable key on a reachable address."""
    from potato_queue.server.guard import admin_key
    from potato_queue.validate_backends import is_weak_admin_key

    key = admin_key(config)
    if key is None:
        return (
            "the admin API refuses every request: no admin key is set "
            "(set admin_api_key in the config, or POTATO_ADMIN_API_KEY)"
        )
    if is_weak_admin_key(key) and not _loopback(host):
        raise PotatoQueueError(
            f"admin_api_key {key!r} is a placeholder anyone can guess, and {host} is reachable from other machines",
            fix="set a real key: admin_api_key in the config or POTATO_ADMIN_API_KEY (e.g. the output of "
            "python -c 'import secrets; print(secrets.token_urlsafe(24))')",
        )
    return "the admin API is open to requests with the project's admin key (header X-API-Key)"


def check_writable(config: ProjectConfig) -> None:
    """Runs are written under the project's output folder: refuse to start when that cannot be done."""
    from potato_queue.store.keys import runs_dir

    folder = runs_dir(config)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise PotatoQueueError(
            f"runs cannot be written in {folder}: {exc.strerror or exc}",
            fix="make the project's output_annotation_dir writable for this account, or point it elsewhere",
        ) from None
