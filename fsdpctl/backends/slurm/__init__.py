"""The Slurm backend: Slurm's client commands, submitit, the nodes' logs, and doctor through srun."""
