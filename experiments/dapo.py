"""DAPO-style (Yu et al., 2025) clip-higher with token-mean aggregation on the quickstart task."""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_base", pathlib.Path(__file__).with_name("_base.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def get_config():
  config = _base.quickstart_config()
  config.advantage = {"name": "grpo"}
  config.objective = {"policy": {
      "name": "ppo_clip",
      "clip_low": 0.2,  # epsilon_low
      "clip_high": 0.28,  # epsilon_high > epsilon_low: clip-higher keeps exploration
      "aggregation": "token-mean",  # every token weighs the same across the batch
  }}
  config.rl.epochs = 2  # updates per batch, so clipping is active
  return config
