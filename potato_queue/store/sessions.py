"""The Training page's sessions and sign-in tries, kept in Redis so that every server process sees the same.

A session cookie is signed (server/session.py), so a forged one never gets
here; what the signature cannot say is that its holder signed out. Redis
keeps the live sessions by their nonce's sha256 (a copy of the database
opens nothing, and the cookie also needs the admin key's signature), with
the session's lifetime as its expiry: a sign-out deletes it, and the cookie
is refused by every server process at its next request. Redis emptied means
everyone signs in again.

Sign-in tries are counted per client: past SIGN_IN_FREE_TRIES a client waits
before each further try, twice as long each time, at most SIGN_IN_MAX_WAIT_S.
A try is counted before the key is compared (one Lua step), so a client that
sends many tries at once gets no more through than one sending them in turn.
"""

from __future__ import annotations

import redis

from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.store.keys import Keys
from potato_queue.store.tokens import token_digest

__all__ = [
    "PageSessions",
    "SignInTries",
    "SIGN_IN_FREE_TRIES",
    "SIGN_IN_FIRST_WAIT_S",
    "SIGN_IN_MAX_WAIT_S",
    "SIGN_IN_WINDOW_S",
]

SIGN_IN_FREE_TRIES = 5
SIGN_IN_FIRST_WAIT_S = 1.0
# Capped so that an admin who shares an address with whoever guesses (a NAT, a proxy) waits a minute, not hours.
SIGN_IN_MAX_WAIT_S = 60.0
# A client's tries are forgotten this long after its last one: the bound on what a flood of addresses leaves.
SIGN_IN_WINDOW_S = 900

# KEYS: the client's tries. ARGV: now (epoch s), free tries, first wait s, max wait s, window s.
# "0" when this try may go on (it is counted), else the seconds to wait (nothing is counted).
TAKE_TRY = """
local now = tonumber(ARGV[1])
local until_s = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
if until_s > now then return tostring(until_s - now) end
local tries = redis.call('HINCRBY', KEYS[1], 'tries', 1)
local free = tonumber(ARGV[2])
if tries >= free then
  local wait_s = math.min(tonumber(ARGV[4]), tonumber(ARGV[3]) * 2 ^ (tries - free))
  redis.call('HSET', KEYS[1], 'until', tostring(now + wait_s))
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
return '0'
"""


class PageSessions:
    """The signed-in sessions (the store's `sessions`)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis, self.keys = client, keys

    def open(self, nonce: str, ttl_s: float) -> None:
        self.redis.set(self.keys.page_session(token_digest(nonce)), "1", ex=max(1, int(ttl_s)))

    def live(self, nonce: str) -> bool:
        return bool(self.redis.exists(self.keys.page_session(token_digest(nonce))))

    def close(self, nonce: str) -> None:
        self.redis.delete(self.keys.page_session(token_digest(nonce)))


class SignInTries:
    """Each client's sign-in tries (the store's `sign_ins`): `take` before a key is compared, `forgive` once
    it was right."""

    def __init__(self, client: redis.Redis, keys: Keys, clock: Clock = REAL_CLOCK) -> None:
        self.redis, self.keys, self.clock = client, keys, clock
        self._take = client.register_script(TAKE_TRY)

    def take(self, client: str) -> float:
        """0 when `client` may try now (the try is counted); else the seconds it must wait first."""
        args = (
            repr(self.clock.now_s()),
            SIGN_IN_FREE_TRIES,
            SIGN_IN_FIRST_WAIT_S,
            SIGN_IN_MAX_WAIT_S,
            SIGN_IN_WINDOW_S,
        )
        return float(self._take(keys=[self.keys.sign_in_tries(client)], args=args))

    def forgive(self, client: str) -> None:
        self.redis.delete(self.keys.sign_in_tries(client))
