"""fsdpctl: launch FSDP/FSDP2 training on many nodes, checked before it starts."""

__version__ = "0.1.0"
