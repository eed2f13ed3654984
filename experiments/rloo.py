"""RLOO (Ahmadian et al., 2024) on the quickstart task: leave-one-out baseline."""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_base", pathlib.Path(__file__).with_name("_base.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def get_config():
  config = _base.quickstart_config()
  config.advantage = {"name": "rloo"}  # r_i - mean_{j != i} r_j
  return config
