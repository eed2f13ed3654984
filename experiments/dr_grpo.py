"""Dr. GRPO (Liu et al., 2025) on the quickstart task: no std scaling, and a
constant length normaliser so long responses are not down-weighted."""

import pathlib
import runpy

# The quickstart config, to be overridden below.
quickstart_config = runpy.run_path(str(pathlib.Path(__file__).with_name("quickstart.py")))[
  "get_config"
]


def get_config():
  config = quickstart_config()
  config.advantage = {"name": "dr_grpo"}  # r - mean_g, no division by the group std
  config.objective = {
    "policy": {
      "name": "ppo_clip",
      "aggregation": "seq-mean-token-sum-norm",  # sum(l * m) / (B * L)
    }
  }
  return config
