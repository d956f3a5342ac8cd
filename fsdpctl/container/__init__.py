"""Running a node's ranks inside a container image: the runtime's command lines (``runtime``) and
what a node's probe says of the runtime and the image (``judge``)."""
