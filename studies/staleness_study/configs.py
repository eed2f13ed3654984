"""What staleness does to credit (studies.staleness_study).

  # CI's check
  python -m studies.staleness_study --config studies/staleness_study/configs.py:smoke --workdir DIR
  # 2 CPU cores
  python -m studies.staleness_study --config studies/staleness_study/configs.py:small --workdir DIR
  # one accelerator
  python -m studies.staleness_study --config studies/staleness_study/configs.py:full --workdir DIR

key_token with the exact oracle (filler-blind, trained from the random policy, the
credit study's shared loss and scale-matched advantages), rollouts k = 0, 1, 4, 16
updates old; arms grpo, ppo_gae, vineppo and the exact oracle, each with no
correction, tis, masked_is and decoupled_ppo; exact J(pi) against generated tokens.
"""

import ml_collections

from studies.credit_study import configs_v1

PRESETS = ("smoke", "small", "full")
ESTIMATORS = ("grpo", "ppo_gae", "vineppo", "oracle")


def _corrections() -> dict:
  """name -> objective. The learner recomputes old_logprobs, so ppo_clip ("none") is
  anchored at the current parameters and ignores the staleness; the others weight or
  mask by pi_old / mu (the sampler's mu)."""
  aggregation = "seq-mean-token-sum-norm"  # the credit study's
  return {
    "none": {"policy": {"name": "ppo_clip", "aggregation": aggregation}},
    "tis": {"policy": {"name": "tis", "cap": 2.0, "aggregation": aggregation}},
    "masked_is": {
      "policy": {"name": "masked_is", "low": 0.5, "high": 2.0, "aggregation": aggregation}
    },
    "decoupled_ppo": {"policy": {"name": "decoupled_ppo", "cap": 5.0, "aggregation": aggregation}},
  }


def get_config(preset: str = "small") -> ml_collections.ConfigDict:
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r}; known: {', '.join(PRESETS)}.")
  config = ml_collections.ConfigDict()
  config.preset = preset
  train = configs_v1.key_token_train()
  config.estimators = {name: configs_v1.estimators_of(vine_k=4)[name] for name in ESTIMATORS}
  config.corrections = _corrections()
  config.staleness = [0, 1, 4, 16]
  config.seeds = [0, 1, 2, 3, 4]
  config.scale = "rms"  # scale-matched credit, as in the credit study
  config.updates = 60  # J(pi) is measured after 0, measure_every, ..., updates updates
  config.measure_every = 10
  train.task.options = {**train.task.options, "length": 12}
  train.model.overrides = {"n_layers": 1, "d_model": 32, "n_heads": 2, "n_kv_heads": 2, "d_ff": 64}
  train.rl.learning_rate = 3e-3
  train.rl.eval_every = 10**6  # J(pi) replaces the greedy evaluation (run once, at the end)
  if preset == "smoke":
    train.task.options = {
      "length": 8,
      "n_decisive": 2,
      "n_keys": 3,
      "n_fillers": 2,
      "filler_blind": True,
    }
    train.task.train_size, train.task.test_size = 64, 9
    train.rl.prompts_per_step, train.rl.group_size = 4, 4
    config.estimators = {name: config.estimators[name] for name in ("grpo", "oracle")}
    config.corrections = {name: config.corrections[name] for name in ("none", "decoupled_ppo")}
    config.staleness, config.seeds = [0, 2], [0]
    config.updates, config.measure_every = 3, 1
  elif preset == "full":
    train.task.options = {**train.task.options, "length": 24}
    train.model.overrides = {
      "n_layers": 2,
      "d_model": 64,
      "n_heads": 4,
      "n_kv_heads": 4,
      "d_ff": 256,
    }
    train.rl.learning_rate = 1e-3
    config.seeds = list(range(10))
    config.updates = 300
  # The layout studies.credit_study.runner.train_config reads.
  config.tasks = {"key_token": {"train": train}}
  config.train = train
  return config
