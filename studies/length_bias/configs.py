"""Dr. GRPO's length bias on target_sum (studies.length_bias).

  python -m studies.length_bias --config studies/length_bias/configs.py:smoke --workdir DIR  # CI
  python -m studies.length_bias --config studies/length_bias/configs.py:small --workdir DIR
  python -m studies.length_bias --config studies/length_bias/configs.py:seeds20 --workdir DIR

Arms: GRPO as published (std-normalised advantages, each response's loss divided by its
length), GRPO without the length division, Dr. GRPO (neither), and lambda-GRPO with a fixed
length preference either way (lam = 1, -1) and with one learnt from lam = 0. target_sum responses
stop at a sampled EOS, so their length is the policy's choice; two regimes, one where the
task rewards length and one where it does not. The seeds20 preset reruns the published
contrast (GRPO, GRPO without the length division, Dr. GRPO) at 20 seeds.
"""

import ml_collections

PRESETS = ("smoke", "small", "seeds20")


def get_config(preset: str = "small") -> ml_collections.ConfigDict:
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r}; known: {', '.join(PRESETS)}.")
  config = ml_collections.ConfigDict()
  config.preset = preset
  config.regimes = {
      # Up to 6 digits in 0..3: S in [3, 15] needs up to 5 digits, so a longer response
      # reaches a larger sum (the task rewards length)...
      "length_rewarded": {"n_digits": 6, "n_values": 4, "target_low": 3, "target_high": 15},
      # ...S in [1, 3] is one digit away, and zeros pad at no cost (it does not).
      "length_free": {"n_digits": 6, "n_values": 4, "target_low": 1, "target_high": 3},
  }
  config.model = {"preset": "tiny",
                  "overrides": {"n_layers": 1, "d_model": 32, "n_heads": 4, "n_kv_heads": 4,
                                "d_ff": 128}}
  config.arms = {
      "grpo": {"advantage": "grpo", "aggregation": "seq-mean-token-mean"},
      "grpo_token_sum": {"advantage": "grpo", "aggregation": "seq-mean-token-sum-norm"},
      "dr_grpo": {"advantage": "dr_grpo", "aggregation": "seq-mean-token-sum-norm"},
      # lambda-GRPO's length preference at a fixed exponent, each way: lam = 1 weighs a
      # group's longer responses more, lam = -1 its shorter ones (token-mean aggregation).
      "lambda_grpo_long": {"advantage": {"name": "lambda_grpo", "lam": 1.0},
                           "aggregation": "token-mean"},
      "lambda_grpo_short": {"advantage": {"name": "lambda_grpo", "lam": -1.0},
                            "aggregation": "token-mean"},
      # ...and learnt from lam = 0 (every response alike) by its own Adam.
      "lambda_grpo_learned": {"advantage": {"name": "lambda_grpo_learned", "lam": 0.0,
                                            "r": 1.0, "lam_learning_rate": 0.01},
                              "aggregation": "token-mean"},
  }
  config.group_size, config.prompts_per_step = 8, 8
  config.updates, config.eval_every = 1000, 100
  config.learning_rate = 3e-3
  config.seeds = [0, 1, 2, 3, 4]
  if preset == "seeds20":  # the published contrast at 20 seeds: 5 leave its sign unresolved
    config.seeds = list(range(20))
    config.arms = {name: config.arms[name].to_dict()
                   for name in ("grpo", "grpo_token_sum", "dr_grpo")}
  if preset == "smoke":
    config.regimes = {"smoke": {"n_digits": 3, "n_values": 3, "target_low": 1,
                                "target_high": 5}}
    config.model.overrides = {"n_layers": 1, "d_model": 32, "n_heads": 2, "n_kv_heads": 2,
                              "d_ff": 64}
    config.group_size, config.prompts_per_step = 2, 4
    config.updates, config.eval_every = 4, 2
    config.seeds = [0, 1]
    config.arms = {name: config.arms[name].to_dict()
                   for name in ("grpo", "dr_grpo", "lambda_grpo_learned")}
  return config
