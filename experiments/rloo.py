"""RLOO (Ahmadian et al., 2024) on the quickstart task: leave-one-out baseline."""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.advantage = {"name": "rloo"}  # r_i - mean_{j != i} r_j
  return config
