"""The ssh transport the ssh and slurm executors share (not an executor of its own): ssh command lines and
the one place they run (openssh.py), one ssh session per run with its bootstrap and handle (session.py),
and the copy back (copy.py)."""
