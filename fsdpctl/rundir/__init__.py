"""Runs on this machine: run ids, the run directory's layout and the registry (``paths``), and
``run.json`` (``record``)."""
