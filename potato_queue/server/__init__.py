"""The FastAPI server: the Training page, the admin JSON API, the agent protocol, /healthz and /metrics.

app.py's create_app wires it; guard.py authenticates every request before its body is read and maps
the core's errors to HTTP statuses in one table; the routes (admin_api, page, page_api, publish_api,
insight_api, agent_api, ops) ask runs/service.py's RunService and decide no rule themselves; claims.py and
claim_door.py hold an idle agent's claim; connections.py caps what a slow client may hold.
"""
