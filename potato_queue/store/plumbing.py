"""Redis plumbing for the run store: its Lua scripts, an asyncio twin of a client, a long-poll.

Only potato_queue.store uses these; they live apart to keep the store's own
module about runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = [
    "CAS_STATE",
    "CLAIM",
    "CLAIM_FIELD",
    "MERGE_METRICS",
    "RECORD_RESULT",
    "REDEEM_CODE",
    "RELEASE_FIELD",
    "SOCKET_TIMEOUT_S",
    "SUPERVISION_SOCKET_TIMEOUT_S",
    "async_twin",
    "client_for",
    "wait_published",
]

# redis-py 8 gives every client a 5 s socket timeout unless told otherwise: a Redis busy for 5 s (a slow
# fsync, a large load) would then fail a run that is training fine. Ours is a hung server's limit, not a
# busy one's; no command of ours blocks for more than a second.
SOCKET_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 10.0
# The executor's client, which supervises a run while it holds the run slot (store/lease.py, 10 s): a call
# that hangs longer than the lease would let the slot go while nothing is decided. A busy Redis costs a
# supervising executor a skipped look (runs/supervise.py waits out a blip), never the run.
SUPERVISION_SOCKET_TIMEOUT_S = 3.0


def client_for(url: str, socket_timeout_s: float = SOCKET_TIMEOUT_S) -> redis.Redis:
    """The Redis client every part of potato-queue uses for `url` (its timeouts set here, once)."""
    # redis-py 8 retries a timed-out call 10 times with backoff: against a frozen Redis one call of the
    # supervising executor would take a minute, far past the lease it must decide within. It tries once;
    # the next look is the retry.
    once = {"retry": Retry(NoBackoff(), 0)} if socket_timeout_s <= SUPERVISION_SOCKET_TIMEOUT_S else {}
    return redis.Redis.from_url(
        url, socket_timeout=socket_timeout_s, socket_connect_timeout=min(CONNECT_TIMEOUT_S, socket_timeout_s), **once
    )


# KEYS: the run's hash, the unfinished index, the run token's digest. ARGV: the
# new state, "1" when it is final, the run id, then the states it may come
# from. A final state also leaves the unfinished index and revokes the run's
# token, in the same step: whoever ends a run (the executor, the orphan sweep,
# a cancel), no token outlives it. -1 when Redis has no live record (emptied),
# so the caller seeds it from disk and tries again.
CAS_STATE = """
local cur = redis.call('HGET', KEYS[1], 'state')
if not cur then return -1 end
for i = 4, #ARGV do
  if cur == ARGV[i] then
    redis.call('HSET', KEYS[1], 'state', ARGV[1])
    if ARGV[2] == '1' then
      redis.call('ZREM', KEYS[2], ARGV[3])
      redis.call('DEL', KEYS[3])
    end
    return 1
  end
end
return 0
"""
# KEYS: the run's hash, the result wake-up list. ARGV: exit code, heartbeat time,
# then field/value pairs. One result per run: 0 when one is already stored.
RECORD_RESULT = """
if redis.call('HSETNX', KEYS[1], 'agent_exit_code', ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'heartbeat_at', ARGV[2])
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('RPUSH', KEYS[2], '1')
redis.call('EXPIRE', KEYS[2], 3600)
return 1
"""
# KEYS: the run's token key. ARGV: the one-time code's marked digest, the new token's digest. The code gives its
# place, and what is left of its time, to the token: 1; 0 for another code, a spent one, or an ended run's.
REDEEM_CODE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
return 1
"""
# KEYS: a hash. ARGV: a field, the value to claim it with. Nothing when the claim is ours, else the value
# of whoever claimed it first: the check and the write in one step (one retry of a run, however many ask).
CLAIM_FIELD = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then return false end
return redis.call('HGET', KEYS[1], ARGV[1])
"""
# KEYS: a hash. ARGV: a field, the value it was claimed with: the claim given back, if still that one's.
RELEASE_FIELD = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""
# KEYS: the agent backend's registration hash, its offers, its drain switch. ARGV: the token's digest, now
# (epoch s), the agent's description (JSON), what it waits for before it claims (JSON: no GPU has room) or '',
# and its word that it drains (JSON) or ''. 'denied' unless the digest is the registered one, so a token
# replaced while its claim waited claims nothing; an agent that waits is only seen (its wait kept for the
# offered runs' step line); one that drains, or any while the drain switch is on, gets 'drain' and no run;
# else the oldest offered run, popped (exactly one agent gets it), or '', and no wait is kept: an agent ready
# to claim takes the run.
# The digests compared are sha256 of 32 random bytes: their compare's timing tells nothing of a token.
CLAIM = """
if redis.call('HGET', KEYS[1], 'digest') ~= ARGV[1] then return 'denied' end
redis.call('HSET', KEYS[1], 'last_seen', ARGV[2], 'agent', ARGV[3])
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'gpu_wait', ARGV[4])
  return ''
end
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'draining', ARGV[5])
  return 'drain'
end
if redis.call('EXISTS', KEYS[3]) == 1 then return 'drain' end
redis.call('HDEL', KEYS[1], 'gpu_wait', 'draining')
local popped = redis.call('ZPOPMIN', KEYS[2])
if #popped == 0 then return '' end
return popped[1]
"""
# KEYS: the run's metrics hash (a field a name, its latest value as JSON). ARGV: the most names it may hold,
# then name/value pairs. A batch touches only its own names: merging into one JSON blob re-encoded the whole
# blob inside Redis for every batch, which stalled Redis for everyone once a run's metrics were large. A name
# the hash holds is updated; a new one is added while there is room. Returns the new names refused.
MERGE_METRICS = """
local room = tonumber(ARGV[1]) - redis.call('HLEN', KEYS[1])
local refused = {}
for i = 2, #ARGV, 2 do
  if room > 0 or redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    room = room - redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  else
    refused[#refused + 1] = ARGV[i]
  end
end
return refused
"""


# A waiter asks whether its caller hung up (or the server is stopping) this often, so a stop or a client gone
# frees it at once instead of at the next reread; both questions are answered in memory. It rereads Redis
# itself (the state a missed publish would have announced) less often.
HANG_UP_TICK_S = 0.1
REREAD_S = 1.0


def async_twin(client: redis.Redis) -> aioredis.Redis:
    """An asyncio client to the same Redis (pub/sub must not hold a thread-pool thread for 30 s)."""
    pool = client.connection_pool
    wanted = ("host", "port", "path", "db", "username", "password", "socket_connect_timeout")
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in wanted or k.startswith("ssl_")}
    if issubclass(pool.connection_class, redis.UnixDomainSocketConnection):
        connection_class: type[Any] = aioredis.UnixDomainSocketConnection
    elif issubclass(pool.connection_class, redis.SSLConnection):
        connection_class = aioredis.SSLConnection
    else:
        connection_class = aioredis.Connection
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith("ssl_")}
    return aioredis.Redis(connection_pool=aioredis.ConnectionPool(connection_class=connection_class, **kwargs))


async def wait_published(
    client: redis.Redis,
    channel: str,
    due: Callable[[aioredis.Redis], Awaitable[bool]],
    wait_s: float,
    hung_up: Callable[[], Awaitable[bool]],
) -> bool:
    """True as soon as `due()` holds or anything is published on `channel`; False after wait_s or once
    `hung_up()` (nobody to answer: the Redis connection is freed, and a shutdown can finish)."""
    twin = async_twin(client)
    pubsub = twin.pubsub()
    loop = asyncio.get_running_loop()
    try:
        await pubsub.subscribe(channel)
        reread_at = loop.time()
        deadline = reread_at + wait_s
        while True:
            # Subscribed first, then due() read: a change made in between is seen one way or the other.
            # It is read again every REREAD_S in case a publish was missed (a reconnect).
            if loop.time() >= reread_at:
                if await due(twin):
                    return True
                reread_at = loop.time() + REREAD_S
            left = deadline - loop.time()
            if left <= 0:
                return False
            if await pubsub.get_message(ignore_subscribe_messages=True, timeout=min(left, HANG_UP_TICK_S)):
                return True
            if await hung_up():
                return False
    finally:
        await pubsub.aclose()
        await twin.aclose()


def refresh_forever(write: Callable[[], None], every_s: float, name: str) -> None:
    """Run `write` now, then every `every_s` in a daemon thread, for the life of the process: a key with a short
    expiry that says something is up comes back after Redis is emptied and lapses once the process is gone.
    A Redis that does not answer is tried again at the next turn."""

    def loop() -> None:
        while True:
            time.sleep(every_s)
            try:
                write()
            except redis.RedisError:
                pass

    try:
        write()
    except redis.RedisError:
        pass
    threading.Thread(target=loop, daemon=True, name=name).start()
