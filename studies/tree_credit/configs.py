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
  # Training at equal generated tokens (batched cells, `jaxcredit.lab`): the flat arms sample
  # 8 independent responses per prompt, the tree arms a tree of 8 leaves (the shared
  # segments generated once, so more updates fit the budget); every arm at one learning
  # rate, the same seeds (the same initial policy per seed).
  config.training = ml_collections.ConfigDict()
  config.training.task = {"length": 12, "n_decisive": 2, "n_keys": 4, "n_fillers": 4,
                          "filler_blind": True}  # chance 1/16; decisive columns 4 and 8
  config.training.segment_tokens = 4
  config.training.model = {"n_layers": 1, "d_model": 32, "n_heads": 4, "n_kv_heads": 4,
                           "d_ff": 128}
  config.training.flat_arms = ("grpo", "oracle")
  config.training.tree_arms = ("grpo", "spo_tree", "treerl", "tempo", "treepo", "tree_grpo")
  config.training.prompts_per_step = 8
  config.training.token_budget = 200_000
  config.training.eval_points = 10
  config.training.learning_rate = 3e-3
  config.training.seeds = list(range(12))  # a sign-flip p can reach 2^-11
  if preset == "smoke":
    config.prompts_per_batch, config.batches = 4, 2
    config.training.model = {"n_layers": 1, "d_model": 16, "n_heads": 2, "n_kv_heads": 2,
                             "d_ff": 32}
    config.training.tree_arms = ("grpo", "treerl")
    config.training.prompts_per_step = 2
    config.training.token_budget = 4_000
    config.training.eval_points = 2
    config.training.seeds = [0, 1]
  return config
