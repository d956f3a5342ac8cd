"""What every rank runs before its own code: this folder is first on the ranks' PYTHONPATH."""
