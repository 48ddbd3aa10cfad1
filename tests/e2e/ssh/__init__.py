"""End to end: ssh."""
