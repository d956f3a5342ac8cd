"""``fsdpctl estimate``'s parts below the API: which choices fit a GPU (``choices``, pure) and where
the trace runs (``runner``: here when torch is, else on a node). The trace itself is the workload's
(``fsdpctl.workload.estimate``), the only part that imports torch."""
