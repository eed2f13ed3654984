"""The credit study's first design on key_token; the sweep
(studies/credit_study/configs.py) replaces it.

  # CI's check: about a minute
  python -m studies.credit_study --config studies/credit_study/configs_v1.py:smoke --workdir DIR
  # ~30 min, 2 CPU cores
  python -m studies.credit_study --config studies/credit_study/configs_v1.py:small --workdir DIR
  # one accelerator
  python -m studies.credit_study --config studies/credit_study/configs_v1.py:full --workdir DIR

key_token (exact credit known: a filler-blind policy, two decisive positions in
24 tokens, trained from the random policy), measured by its exact expected
success J(pi) on held-out prompts. (Arithmetic, where every one of <= 4
response tokens decides the reward, is a task but not part of the study: it
cannot tell credit methods apart.) Every estimator trains the
same policy (same initialisation, prompts and evaluation per seed) with the
same loss: PPO-clip with one gradient step per batch (ratio 1: a plain policy
gradient with the estimator's credit), no KL, no entropy bonus, temperature 1,
advantages divided by their batch RMS so one learning rate serves all
("scale-matched"). During the first seed's GRPO run on key_token the study
scores every estimator's credit on the same batches against the exact oracle.
"""

import ml_collections

from jaxcredit.train import base_config

PRESETS = ("smoke", "small", "trainers", "full")


def estimators_of(vine_k: int) -> dict:
  """name -> advantage config (see estimators.from_config); `critic: True` trains a
  value model (scored on the shared batches with a shadow critic); `learned:
  True` marks credit from another model trained along the run (not scored)."""
  return {
    "grpo": {"advantage": {"name": "grpo"}},  # (R - mean_g) / std_g on every token
    "dr_grpo": {"advantage": {"name": "dr_grpo"}},  # R - mean_g
    "rloo": {"advantage": {"name": "rloo"}},  # R - mean of the other G - 1
    "ppo_gae": {"advantage": {"name": "gae", "lam": 0.95}, "critic": True},  # learned critic
    "vineppo": {
      "advantage": {"name": "vineppo", "k": vine_k, "positions": "stride:4"}
    },  # MC values
    "prime": {"advantage": {"name": "prime", "beta": 0.05}, "learned": True},  # implicit PRM
    "entropy80": {
      "advantage": {"mask": "high_entropy", "rho": 0.2, "of": "grpo"}
    },  # top-20% entropy tokens
    "ktae": {"advantage": {"name": "ktae"}},  # GRPO + per-group key-token scores
    "oracle": {"advantage": {"name": "oracle"}},  # exact A(s_t, y_t) (uncharged upper bound)
    "oracle_seq": {
      "advantage": {"name": "oracle_seq"}
    },  # R - V(x): exact baseline, no localisation
  }


def _shared_rl(train: ml_collections.ConfigDict) -> None:
  """What every estimator shares: the loss, the optimizer and the sampling."""
  train.rl.group_size = 8  # 8 samples per prompt
  train.rl.learning_rate = 1e-3  # one rate for all (advantages are RMS-scaled)
  train.rl.max_grad_norm = 1.0
  train.rl.epochs = 1  # one gradient step per batch: ratio 1, clipping inactive
  train.rl.minibatches = 1
  train.rl.temperature = 1.0
  train.critic.learning_rate = 1e-3  # ppo_gae's critic (same architecture, scalar head)
  train.checkpoint.every = 50
  train.objective = {"policy": {"name": "ppo_clip", "aggregation": "seq-mean-token-sum-norm"}}


def key_token_train() -> ml_collections.ConfigDict:
  train = base_config.get_config()
  train.task.name = "key_token"
  train.task.options = {
    "length": 24,  # T response tokens
    "n_decisive": 2,  # K decisive positions (spread: 8 and 16)
    "n_keys": 4,  # |C|: chance success 1/16
    "n_fillers": 4,  # |F| filler symbols
    "rule": "all",  # R = 1 iff both decisive tokens copy their keys
    "filler_blind": True,  # filler never enters a later input: the exact oracle E-DEC applies
  }
  train.task.train_size = 4096
  train.task.test_size = 64  # greedy evaluation prompts
  train.model.overrides = {
    "n_layers": 2,
    "d_model": 64,
    "n_heads": 4,
    "n_kv_heads": 4,
    "d_ff": 256,
  }  # ~0.1M
  train.sft.max_steps = 0  # start from the random (near-uniform) policy
  _shared_rl(train)
  train.rl.steps = 100
  train.rl.prompts_per_step = 8  # 64 responses per step
  train.rl.eval_every = 10
  return train


def get_config(preset: str = "small") -> ml_collections.ConfigDict:
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r}; known: {', '.join(PRESETS)}.")
  config = ml_collections.ConfigDict()
  config.preset = preset
  config.estimators = estimators_of(vine_k=4)
  # Per task: its training config, the estimators run on it, and whether credit is scored
  # against the exact oracle.
  config.tasks = {
    "key_token": {
      "train": key_token_train(),
      "scored": True,
      "estimators": [
        "grpo",
        "dr_grpo",
        "rloo",
        "ppo_gae",
        "vineppo",
        "prime",
        "entropy80",
        "ktae",
        "oracle",
        "oracle_seq",
      ],
    },
  }
  config.seeds = [0, 1, 2]  # the unit of replication (init, prompts, sampling)
  config.scale = "rms"  # "rms": scale-matched credit; "native": as the estimator gives it
  config.score_at = [0.0, 0.5, 1.0]  # fractions of training at which the first GRPO run is scored
  config.mc_check_k = 64  # continuations per state for the Monte-Carlo vs exact check
  config.mc_check_rows = 16  # responses in that check
  config.resamples = 8  # fresh groups around fixed probe responses, for credit stability (RCN)
  config.bootstrap = 10000  # resamples for confidence intervals over seeds

  key_token = config.tasks.key_token.train
  if preset == "smoke":
    key_token.task.options = {
      "length": 8,
      "n_decisive": 2,
      "n_keys": 3,
      "n_fillers": 2,
      "filler_blind": True,
    }
    key_token.task.train_size, key_token.task.test_size = 64, 9
    key_token.model.overrides = {
      "n_layers": 1,
      "d_model": 32,
      "n_heads": 2,
      "n_kv_heads": 2,
      "d_ff": 64,
    }
    key_token.rl.steps, key_token.rl.prompts_per_step, key_token.rl.group_size = 5, 4, 4
    key_token.rl.eval_every, key_token.rl.learning_rate = 2, 3e-3
    config.estimators = estimators_of(vine_k=2)
    config.tasks.key_token.estimators = ["grpo", "vineppo", "oracle"]
    config.seeds = [0]
    config.score_at = [0.0, 1.0]
    config.mc_check_k, config.mc_check_rows, config.bootstrap, config.resamples = 32, 8, 1000, 2
  elif preset == "full":
    key_token.model.overrides = {
      "n_layers": 4,
      "d_model": 256,
      "n_heads": 8,
      "n_kv_heads": 8,
      "d_ff": 1024,
    }
    key_token.task.options = {**key_token.task.options, "length": 64, "n_decisive": 4}
    key_token.rl.steps, key_token.rl.prompts_per_step, key_token.rl.group_size = 2000, 32, 16
    config.estimators = {
      **estimators_of(vine_k=9),
      "spo_chain": {"advantage": {"name": "spo", "k": 9, "positions": "cutpoints:0.9"}},
    }
    config.tasks.key_token.estimators = [*config.tasks.key_token.estimators, "spo_chain"]
    config.seeds = list(range(10))
    config.score_at = [0.0, 0.25, 0.5, 1.0]
  elif preset == "trainers":
    # One answer from both trainers: GRPO and the exact credit at one rate (1e-3) on the
    # default policy, 300 updates of 8 prompts at G = 8 and 32, exact J every 25 updates,
    # 10 seeds; the credit study's `trainers` preset runs the same cells in the batched lab.
    config.tasks = {f"key_token_G{g:02d}": {"train": _trainers_cell(key_token, g), "scored": False,
                                        "estimators": ["grpo", "oracle"]} for g in (8, 32)}
    config.seeds = list(range(10))
  for (
    name,
    spec,
  ) in config.tasks.items():  # four per-token exports per run (python -m jaxcredit.view)
    export = spec.train.export
    export.every, export.groups = max(1, spec.train.rl.steps // 4), 2
    export.compare = ("oracle",) if spec.train.task.name == "key_token" else ()
    if preset == "trainers":
      export.every = 0
  return config


def _trainers_cell(train: ml_collections.ConfigDict, group_size: int) -> ml_collections.ConfigDict:
  """`train` at G = group_size, exact J every 25 updates up to 300 (the hook measures the
  policy before an update: one more update measures the 300th)."""
  cell = ml_collections.ConfigDict(train.to_dict())
  cell.rl.group_size, cell.rl.steps, cell.rl.eval_every = group_size, 301, 25
  return cell
