"""The Typer command line: one small module per command; errors become one line at the edge."""
