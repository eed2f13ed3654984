"""Tree credit against the exact oracle (studies.tree_credit).

  python -m studies.tree_credit --config studies/tree_credit/configs.py:smoke --workdir DIR  # CI
  python -m studies.tree_credit --config studies/tree_credit/configs.py:small --workdir DIR

Each task samples trees of 8 leaves per prompt (2 chains, each forking twice into 2) from
one policy, and every tree estimator's credit on the leaves is scored against the task's
exact credit, beside GRPO's broadcast credit on the same leaves and on independent
responses.
"""

import ml_collections

PRESETS = ("smoke", "small")


def get_config(preset: str = "small") -> ml_collections.ConfigDict:
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r}; known: {', '.join(PRESETS)}.")
  config = ml_collections.ConfigDict()
  config.preset = preset
  config.tasks = {
      # Two decisive keys of two (chance 1/4) at columns 4 and 8 of 12, filler hidden: the
      # forks after 4 and 8 columns fall right before each decisive token.
      "key_token": {"task": {"name": "key_token", "options": {
          "length": 12, "n_decisive": 2, "n_keys": 2, "n_fillers": 4, "rule": "all",
          "filler_blind": True}}, "segment_tokens": 4},
      # Up to 6 digits in 0..3 summing to S in [3, 9], EOS allowed: forks after 2 and 4 digits.
      "target_sum": {"task": {"name": "target_sum", "options": {
          "n_digits": 6, "n_values": 4, "target_low": 3, "target_high": 9}},
          "segment_tokens": 2},
  }
  config.tree = {"roots": 2, "branching": 2, "depth": 2}
  config.model = {"preset": "tiny", "seed": 0}
  config.prompts_per_batch = 16
  config.batches = 8
  config.estimators = ("grpo", "spo_tree", "treerl", "tempo", "treepo", "tree_grpo")
  if preset == "smoke":
    config.prompts_per_batch, config.batches = 4, 2
  return config
