"""The agent that runs next to the trainer (standard library only, Python 3.8+).

It is copied to bare hosts by the ssh and slurm backends and installed by hand
for the agent backend, so nothing here may import outside the standard library
at module level.
"""
