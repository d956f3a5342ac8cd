"""The Slurm backend: Slurm's client commands, submitit, the nodes' logs, and doctor through srun.

``plan``: where a job's nodes are and its batch directives; ``scripts``: the batch script;
``states``: Slurm's words for a job's state; ``backend``: the ``Backend`` itself."""

from .backend import SlurmBackend

__all__ = ["SlurmBackend"]
