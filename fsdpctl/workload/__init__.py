"""The bundled GPT training job that runs on the nodes under torchrun.

Only ``config`` may be imported by the CLI process: every other module here imports torch.
"""
