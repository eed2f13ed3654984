"""The length-bias study (README.md beside this file)."""
