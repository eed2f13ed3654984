"""GSPO (Zheng et al., 2025) on the quickstart task: sequence-level ratio and clipping."""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.advantage = {"name": "grpo"}  # sequence advantages, broadcast to tokens
  config.objective = {
    "policy": {
      "name": "gspo",
      "clip_low": 3e-4,  # the paper's sequence-ratio clip range
      "clip_high": 4e-4,
    }
  }
  config.rl.epochs = 2  # a second pass makes the ratio (and so the clip) matter
  return config
