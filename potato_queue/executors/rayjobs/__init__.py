"""Ray's Jobs API as the ray executor speaks it: text.py (what is sent and read, pure functions) and client.py
(the HTTP calls)."""
