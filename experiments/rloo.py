"""RLOO (Ahmadian et al., 2024) on the quickstart task: leave-one-out baseline."""

import pathlib
import runpy

# The quickstart config, to be overridden below.
quickstart_config = runpy.run_path(str(pathlib.Path(__file__).with_name("quickstart.py")))[
  "get_config"
]


def get_config():
  config = quickstart_config()
  config.advantage = {"name": "rloo"}  # r_i - mean_{j != i} r_j
  return config
