"""Command-line entry points (the only modules that parse flags or print)."""
