"""Dr. GRPO (Liu et al., 2025) on the quickstart task: no std scaling, and a
constant length normaliser so long responses are not down-weighted."""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.advantage = {"name": "dr_grpo"}  # r - mean_g, no division by the group std
  config.objective = {
    "policy": {
      "name": "ppo_clip",
      "aggregation": "seq-mean-token-sum-norm",  # sum(l * m) / (B * L)
    }
  }
  return config
