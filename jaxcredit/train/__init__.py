"""Training: SFT warm start and RL from outcome reward (`python -m jaxcredit.train`)."""
