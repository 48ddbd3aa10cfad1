"""`potato-queue potato ...`: what is set up on Potato's side (its environment), not potato-queue's."""

from __future__ import annotations

import subprocess
import sys

import click

from potato_queue.errors import PotatoQueueError

__all__ = ["potato"]

_PROBE = "import potato.training.registry as r; print('yes' if 'potato-queue-remote' in r.trainer_names() else 'no')"


def _known_to_potato() -> str:
    """'yes', 'no', or why it cannot be told, from a fresh interpreter (as Potato's worker child starts)."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd="/"
    )
    if proc.returncode != 0:
        return f"potato-annotation cannot be imported by {sys.executable}"
    return proc.stdout.strip()


@click.group()
def potato() -> None:
    """Potato's side: the potato-queue-remote trainer in Potato's environment."""


@potato.command("install-trainer")
@click.option("--site-dir", default=None, help="site-packages to write to (default: this Python's).")
def install_trainer(site_dir: str | None) -> None:
    """Make potato-queue-remote one of Potato's trainers, in its server and its worker child.

    Run it with the potato-queue installed in Potato's own environment: it writes one line
    (potato_queue_remote.pth) into that environment's site-packages.
    """
    from potato_queue.potato_hook import write_pth

    try:
        path = write_pth(site_dir)
    except OSError as exc:
        raise PotatoQueueError(
            f"{exc.filename or site_dir} cannot be written: {exc.strerror}",
            fix="run it as the account that owns Potato's environment, or give --site-dir",
        ) from None
    click.echo(f"wrote {path}")
    known = _known_to_potato()
    if known != "yes":
        raise PotatoQueueError(
            f"Potato does not list potato-queue-remote yet: {known}",
            fix="run this with the python of the environment Potato runs in "
            "(pip install 'potato-queue[potato]' there first)",
        )
    click.echo(
        f"potato-queue-remote is one of Potato's trainers for every Potato started with {sys.executable}; "
        "restart Potato's server to see it on its Training page"
    )


@potato.command("remove-trainer")
@click.option("--site-dir", default=None, help="site-packages to remove it from (default: this Python's).")
def remove_trainer(site_dir: str | None) -> None:
    """Take potato-queue-remote out of Potato's trainers again."""
    from potato_queue.potato_hook import remove_pth

    removed = remove_pth(site_dir)
    click.echo(f"removed {removed}" if removed else "potato-queue-remote was not installed there")
