"""DAPO-style (Yu et al., 2025) clip-higher on the quickstart task.

What differs from the quickstart: clip_high = 0.28 > clip_low = 0.2 (the
upper clip lets low-probability tokens grow, keeping exploration) and two
epochs per batch, so the clip is active. Token-mean aggregation, DAPO's other
change, is already `ppo_clip`'s default and so the quickstart's as well.
"""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.advantage = {"name": "grpo"}
  config.objective = {
    "policy": {
      "name": "ppo_clip",
      "clip_low": 0.2,  # epsilon_low
      "clip_high": 0.28,  # epsilon_high > epsilon_low: clip-higher keeps exploration
      "aggregation": "token-mean",  # every token weighs the same across the batch
    }
  }
  config.rl.epochs = 2  # updates per batch, so clipping is active
  return config
