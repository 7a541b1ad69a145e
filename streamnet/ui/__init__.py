"""The web UI (streamnet-ui, and train --ui): the cluster, each topology's graph and
figures, and training curves, read from the coordinator and the workers' /status.

It sits beside cli/: it may import runtime and training, nothing imports it."""
