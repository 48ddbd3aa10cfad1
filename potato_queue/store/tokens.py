"""Tokens: made here, kept only as their sha256, compared in constant time.

A token is never stored, logged or put on a command line; what Redis keeps
is its digest (keys.Keys.run_token), so a copy of the database opens nothing.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any

import redis

from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.store.keys import Keys
from potato_queue.store.plumbing import REDEEM_CODE
from potato_queue.store.records import as_text

__all__ = [
    "new_token",
    "token_digest",
    "token_matches",
    "RunTokens",
    "CODE_MARK",
    "AgentTokens",
    "WAKE_EVERYONE",
    "AGENT_TOKEN_TRUST_S",
    "TrustedAgentTokens",
]


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


# What marks a one-time code's digest where a run's token digest goes: no token's digest starts with it.
CODE_MARK = "code:"


class RunTokens:
    """One project's run tokens (the store's `tokens`): a token opens one run until that run ends (its
    final state deletes it, in the store's compare-and-set) or it expires."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis, self.keys = client, keys
        self._redeem = client.register_script(REDEEM_CODE)

    def issue(self, run_id: str, ttl_s: float) -> str:
        """A fresh token for one run; only its sha256 is kept, for ttl_s at most."""
        token = new_token()
        self.redis.set(self.keys.run_token(run_id), token_digest(token), ex=max(1, int(ttl_s)))
        return token

    def verify(self, run_id: str, token: str) -> bool:
        return token_matches(self.redis.get(self.keys.run_token(run_id)), token)

    def issue_code(self, run_id: str, ttl_s: float) -> str:
        """A one-time code that redeem() trades for the run's token, for a backend that shows what it is given
        (a Ray job's environment is on the dashboard). It holds the token's place (CODE_MARK and its digest), so
        it opens nothing itself, dies with the run as a token does, and is spent by its first redeem."""
        code = new_token()
        self.redis.set(self.keys.run_token(run_id), CODE_MARK + token_digest(code), ex=max(1, int(ttl_s)))
        return code

    def redeem(self, run_id: str, code: str) -> str | None:
        """The run's token for its one-time code (the token takes the code's place, with what is left of its
        time); None for a wrong code, one spent already, or a run that ended."""
        token = new_token()
        traded = self._redeem(
            keys=[self.keys.run_token(run_id)], args=[CODE_MARK + token_digest(code), token_digest(token)]
        )
        return token if traded == 1 else None

    def revoke(self, run_id: str) -> None:
        self.redis.delete(self.keys.run_token(run_id))


# An offered-channel message that starts with this wakes every claim waiting for the backend named after it
# (a plain backend name wakes one).
WAKE_EVERYONE = "*"
# How long a server process may take an agent backend's token as valid without asking Redis again, once Redis
# accepted it (the guard and an idle claim, P7): thousands of idle agents share one token. A register's new
# token still refuses the old one's claims at once (the claim asks Redis after a WAKE_EVERYONE).
AGENT_TOKEN_TRUST_S = 10.0


class TrustedAgentTokens:
    """One server process's memory of the backend tokens Redis accepted lately: the guard and the claim
    long-poll share it, and a register (WAKE_EVERYONE) makes it forget the backend's."""

    MAX_KEPT = 256

    def __init__(self) -> None:
        self._accepted: dict[tuple[str, str], float] = {}  # (backend, token digest) -> when (monotonic s)

    def trusted(self, backend: str, digest: str, now_s: float) -> bool:
        accepted_s = self._accepted.get((backend, digest))
        return accepted_s is not None and now_s - accepted_s < AGENT_TOKEN_TRUST_S

    def accept(self, backend: str, digest: str, now_s: float) -> None:
        if len(self._accepted) > self.MAX_KEPT:
            self._accepted.clear()
        self._accepted[backend, digest] = now_s

    def forget(self, backend: str) -> None:
        for key in [key for key in self._accepted if key[0] == backend]:
            del self._accepted[key]


class AgentTokens:
    """One project's agent-backend tokens (the store's `agents`).

    A backend has at most one token: registering again replaces it, and the old one stops working
    at once, a claim already waiting included (the claim compares digests in the same Lua step that
    pops the run). Redis keeps its digest, when it was made, when an agent last asked for work and
    what that agent said of itself (host, Python, trainer packages).
    """

    def __init__(self, client: redis.Redis, keys: Keys, clock: Clock = REAL_CLOCK) -> None:
        self.redis, self.keys, self.clock = client, keys, clock

    def issue(self, backend: str) -> str:
        """A fresh token for `backend`, replacing (and revoking) the one before it."""
        token, key = new_token(), self.keys.agent_token(backend)
        old = self.redis.hget(key, "digest")
        pipe = self.redis.pipeline()
        if old is not None:
            pipe.delete(self.keys.agent_token_owner(as_text(old)))
        pipe.delete(key)
        pipe.hset(key, mapping={"digest": token_digest(token), "created_at": repr(self.clock.now_s())})
        pipe.set(self.keys.agent_token_owner(token_digest(token)), backend)
        pipe.publish(
            self.keys.offered, WAKE_EVERYONE + backend
        )  # every claim waiting tries again: the old token's are refused
        pipe.execute()
        return token

    def registration(self, backend: str) -> dict[str, Any] | None:
        """created_at, last_seen (epoch s; None before an agent asked) and the agent's own description."""
        fields = {as_text(k): as_text(v) for k, v in self.redis.hgetall(self.keys.agent_token(backend)).items()}
        if "digest" not in fields:
            return None
        return {
            "created_at": float(fields["created_at"]),
            "last_seen": float(fields["last_seen"]) if "last_seen" in fields else None,
            "agent": json.loads(fields["agent"]) if "agent" in fields else None,
            "draining": json.loads(fields["draining"]) if "draining" in fields else None,
        }

    def verify(self, backend: str, token: str) -> bool:
        return token_matches(self.redis.hget(self.keys.agent_token(backend), "digest"), token)

    def owner_of(self, token: str) -> str | None:
        """The backend this token was issued for, if it is still registered."""
        owner = self.redis.get(self.keys.agent_token_owner(token_digest(token)))
        return None if owner is None else as_text(owner)
