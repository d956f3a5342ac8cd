"""Where a job runs: this machine, SSH nodes, or a Slurm allocation."""
