"""Dr. GRPO (Liu et al., 2025) on the quickstart task: no std scaling, and a
constant length normaliser so long responses are not down-weighted."""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_base", pathlib.Path(__file__).with_name("_base.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def get_config():
  config = _base.quickstart_config()
  config.advantage = {"name": "dr_grpo"}  # r - mean_g, no division by the group std
  config.objective = {"policy": {
      "name": "ppo_clip",
      "aggregation": "seq-mean-token-sum-norm",  # sum(l * m) / (B * L)
  }}
  return config
