"""The model as the annotation team's tool: what a run says beyond its scores (what to label next, whether
more labels will help, two runs side by side, whether it is good enough to prelabel with). Read from the
run's predictions, its bundle and the project's annotations on this server, so the same for every backend."""
