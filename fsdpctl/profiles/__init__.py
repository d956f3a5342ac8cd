"""Cluster profiles: the schema (``schema``), the strict YAML loader and search path (``loader``), the
rules a section keeps beyond its types (``rules``), and the reference generated from the schema (``reference``)."""
