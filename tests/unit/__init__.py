"""The in-process tier: pure functions, and the lifecycle on a stub backend and a manual clock (seconds)."""
