"""The start-gradient study (README.md beside this file)."""
