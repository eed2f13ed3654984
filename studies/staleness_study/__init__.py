"""The staleness study (README.md beside this file)."""
