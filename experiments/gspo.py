"""GSPO (Zheng et al., 2025) on the quickstart task: sequence-level ratio and clipping."""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_base", pathlib.Path(__file__).with_name("_base.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def get_config():
  config = _base.quickstart_config()
  config.advantage = {"name": "grpo"}  # sequence advantages, broadcast to tokens
  config.objective = {"policy": {
      "name": "gspo",
      "clip_low": 3e-4,  # the paper's sequence-ratio clip range
      "clip_high": 4e-4,
  }}
  config.rl.epochs = 2  # a second pass makes the ratio (and so the clip) matter
  return config
