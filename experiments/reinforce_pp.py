"""REINFORCE++-baseline (Hu, 2025) on the quickstart task: group-centred rewards
whitened over the batch, with a k3 KL-to-reference loss term."""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_base", pathlib.Path(__file__).with_name("_base.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def get_config():
  config = _base.quickstart_config()
  config.advantage = {"name": "reinforce_pp_baseline"}  # whiten(r - mean_g) over valid tokens
  config.objective = {
      "policy": {"name": "ppo_clip"},  # clip 0.2 both sides
      "kl": {"name": "kl", "coef": 0.01, "kind": "k3"},  # KL to the post-SFT reference
  }
  return config
