"""The package version (one place; read by the public face, the environment report and reports)."""

__version__ = "0.1.0"
