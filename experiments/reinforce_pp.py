"""REINFORCE++-baseline (Hu, 2025) on the quickstart task: group-centred rewards
whitened over the batch, with a k3 KL-to-reference loss term."""

import pathlib
import runpy

# The quickstart config, to be overridden below.
quickstart_config = runpy.run_path(str(pathlib.Path(__file__).with_name("quickstart.py")))["get_config"]


def get_config():
  config = quickstart_config()
  config.advantage = {"name": "reinforce_pp_baseline"}  # whiten(r - mean_g) over valid tokens
  config.objective = {
      "policy": {"name": "ppo_clip"},  # clip 0.2 both sides
      "kl": {"name": "kl", "coef": 0.01, "kind": "k3"},  # KL to the post-SFT reference
  }
  return config
