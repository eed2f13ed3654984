"""The turn study (README.md beside this file)."""
