"""The bundled GPT training job that runs on the nodes under torchrun.

Only ``config`` (and this package's constants) may be imported by the CLI process: every other
module here imports torch.
"""

REQUIREMENTS = ("torch", "numpy", "tokenizers")
"""The distributions the workload imports on every node: doctor and launch's preflight check each
node has them, and compare their versions across nodes."""
