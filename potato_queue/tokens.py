"""Tokens: made here, kept only as their sha256, compared in constant time.

A token is never stored, logged or put on a command line; what Redis keeps
is its digest (keys.Keys.run_token), so a copy of the database opens nothing.
"""

from __future__ import annotations

import hashlib
import secrets

__all__ = ["new_token", "token_digest", "token_matches"]


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe text."""
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """The hex sha256 that is stored in place of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(stored_digest: bytes | str | None, token: str) -> bool:
    """Whether `token` is the one whose digest was stored (False when none was)."""
    if stored_digest is None:
        return False
    stored = stored_digest.decode() if isinstance(stored_digest, bytes) else stored_digest
    return secrets.compare_digest(stored, token_digest(token))
