"""potato-queue: remote training for Potato annotation projects."""

__version__ = "0.1.0"
