"""The credit study: does token-level credit matter? (README.md beside this file)."""
