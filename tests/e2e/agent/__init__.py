"""End to end: agent."""
