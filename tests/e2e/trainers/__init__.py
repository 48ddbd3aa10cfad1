"""End to end: trainers."""
