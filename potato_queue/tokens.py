"""Tokens: made here, kept only as their sha256, compared in constant time.

A token is never stored, logged or put on a command line; what Redis keeps
is its digest (keys.Keys.run_token), so a copy of the database opens nothing.
"""

from __future__ import annotations

import hashlib
import secrets

import redis

from potato_queue.keys import Keys

__all__ = ["new_token", "token_digest", "token_matches", "RunTokens", "OTHER_RUNS_CHECKED"]

# How many of the project's latest runs a rejected token is compared against
# to answer 403 ("another run's token") rather than 401.
OTHER_RUNS_CHECKED = 256


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


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RunTokens:
    """One project's run tokens (the store's `tokens`): a token opens one run until that run ends (its
    final state deletes it, in the store's compare-and-set) or it expires."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis, self.keys = client, keys

    def issue(self, run_id: str, ttl_s: float) -> str:
        """A fresh token for one run; only its sha256 is kept, for ttl_s at most."""
        token = new_token()
        self.redis.set(self.keys.run_token(run_id), token_digest(token), ex=max(1, int(ttl_s)))
        return token

    def verify(self, run_id: str, token: str) -> bool:
        return token_matches(self.redis.get(self.keys.run_token(run_id)), token)

    def of_another_run(self, run_id: str, token: str) -> bool:
        """True when `token` opens one of the project's recent runs other than `run_id` (403, not 401)."""
        ids = [_text(r) for r in self.redis.zrevrange(self.keys.runs, 0, OTHER_RUNS_CHECKED - 1)]
        others = [r for r in ids if r != run_id]
        if not others:
            return False
        stored = self.redis.mget([self.keys.run_token(r) for r in others])
        return any(token_matches(digest, token) for digest in stored if digest is not None)

    def revoke(self, run_id: str) -> None:
        self.redis.delete(self.keys.run_token(run_id))
