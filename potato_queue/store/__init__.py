"""The run store: one project's runs on disk (run.json, run.log) and live in Redis.

`RunStore` (run_store.py) is the facade the rest of potato-queue asks; its
named parts are a run in flight as Redis holds it (in_flight.py: live fields,
metrics, the agent's result, the stop flag), the slot lease (lease.py),
presence (presence.py: the server's address, the executors alive), the agent
backends' offers and claims (offers.py), tokens (tokens.py), records held while
a folder takes no writes (pending.py), the Training page's sessions and sign-in
tries (sessions.py), auto-retrain's lock and last check (retrain_state.py) and
Potato's own store (potato_ledger.py; whether write-back is on:
potato_compat.py). keys.py names every Redis key and run path; records.py
says how a record is written; plumbing.py holds the Lua scripts and the
asyncio twin of the client.
"""

from potato_queue.store.run_store import RunStore

__all__ = ["RunStore"]
