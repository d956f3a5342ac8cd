"""The launch plan, pure: ``make_plan`` turns a profile and the command line into every value the
scripts need (``types``, ``make``, ``slurm``), and ``render`` writes the scripts from it."""
