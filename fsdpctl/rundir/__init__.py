"""Runs on this machine: run ids, the run directory's layout and the registry (``paths``),
``run.json`` (``record``), and the registry index every listing of runs reads (``index``)."""
