"""Checking hosts before a job hangs on them: the probe that runs on every node (``probe_script``),
building and reading its command (``probe``), judging one host and diffing them all (``checks``),
probing every host in parallel (``fanout``), and reading the collective smoke test (``collectives``)."""
