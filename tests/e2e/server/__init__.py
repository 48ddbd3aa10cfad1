"""End to end: server."""
