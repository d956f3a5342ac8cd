"""Answers about a running job: every rank's stack grouped (which rank is the odd one, and where),
the hang watchdog, and what is kept when a run hangs."""
