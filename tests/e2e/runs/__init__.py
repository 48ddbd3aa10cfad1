"""End to end: runs."""
