"""Helpers fsdpctl ships to the nodes with the workload (``pkg/fsdpctl/node``): standard library only,
they run with the node's Python next to the user's ranks."""
