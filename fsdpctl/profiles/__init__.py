"""Cluster profiles: the schema (``schema``), the strict YAML loader and search path (``loader``), and
the reference generated from the schema's docstrings (``reference``)."""
