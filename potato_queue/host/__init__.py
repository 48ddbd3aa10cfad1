"""What an ssh host runs before any agent exists: standard library only, Python 3.8+, each module sent as
`python -c <its source>` (boot: an ssh run's setup; check: `training check`; fetch: the copy back) and
gpus.py, which picks a run's GPU there (and for `training check` here)."""
