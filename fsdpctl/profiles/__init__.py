"""Cluster profiles: the schema (``schema``), the strict YAML loader and search path (``loader``), the
rules a section must keep beyond its types (``rules``), and
the reference generated from the schema's docstrings (``reference``)."""
