"""``fsdpctl report``'s parts below the API: a run's ``metrics.jsonl`` read back (``rows``), summed
up (``summary``) and drawn (``plots``, the only matplotlib importer, an optional extra)."""
