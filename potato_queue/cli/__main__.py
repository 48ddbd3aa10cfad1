"""python -m potato_queue.cli: the same as the potato-queue command."""

from potato_queue.cli.main import main

main()
