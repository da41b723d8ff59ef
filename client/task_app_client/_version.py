"""The distribution's version (pyproject.toml reads it from here)."""

VERSION = "0.1.0"
