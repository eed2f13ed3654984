"""Does turn-level credit matter? (studies.turn_study)

  # CI's check
  python -m studies.turn_study --config studies/turn_study/configs.py:smoke --workdir DIR
  # 2 CPU cores
  python -m studies.turn_study --config studies/turn_study/configs.py:small --workdir DIR
  # along the number of turns: 4, 16, 64 and 256 (an accelerator's work at 256)
  python -m studies.turn_study --config studies/turn_study/configs.py:along_turns --workdir DIR
  # its arms without continuations at 4, 16 and 64 turns, 3 seeds (2 CPU cores, ~2 h)
  python -m studies.turn_study --config studies/turn_study/configs.py:along_turns_cpu \\
      --workdir DIR

key_turns (one-token turns, decisive turns 1 and 3, outcome reward), trained from the
random policy, in two regimes: 4 turns, and 8 (four turns after the last key, which cannot
matter: noise for broadcast credit, as filler after the last decisive token is in the credit
study). Arms: trajectory-level grpo, the turn-level mt_grpo, gigpo, the unbiased per-turn
baseline and turn_vine (4 continuations per turn, charged), the exact turn oracle and its
sequence-level control oracle_seq; exact J(pi) against generated tokens, and each arm's
credit scored per turn against the exact turn credit.
"""

import ml_collections

from experiments import key_turns_grpo

PRESETS = ("smoke", "small", "along_turns", "along_turns_cpu")
# The number of turns, the decisive turns (1 and 3) the same in each: 4, 16, 64 and 256 turns,
# every action after turn 3 irrelevant and hidden from later turns (so the exact turn oracle
# stays tractable at 256 turns). Its prediction is stated in the study's README.
ALONG_TURNS = {f"turns_{n:03d}": {"n_turns": n, "hidden_actions": True} for n in (4, 16, 64, 256)}
ESTIMATORS = {
  "grpo": {"name": "grpo"},
  "mt_grpo": {"name": "mt_grpo"},
  "gigpo": {"name": "gigpo"},
  "turn_baseline": {"name": "turn_baseline", "k": 4},
  "turn_vine": {"name": "turn_vine", "k": 4},
  "oracle": {"name": "oracle"},
  "oracle_seq": {"name": "oracle_seq"},
}


def get_config(preset: str = "small") -> ml_collections.ConfigDict:
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r}; known: {', '.join(PRESETS)}.")
  config = ml_collections.ConfigDict()
  config.preset = preset
  train = key_turns_grpo.get_config()
  train.model.overrides = {"n_layers": 1, "d_model": 64, "n_heads": 4, "n_kv_heads": 4, "d_ff": 128}
  train.rl.prompts_per_step, train.rl.group_size = 16, 8
  train.rl.eval_every = 10**6  # J(pi) replaces the greedy evaluation (run once, at the end)
  train.export.every = 0
  train.task.test_size = 16
  config.estimators = ESTIMATORS
  # key_turns options per regime, over the training config's (decisive turns 1 and 3).
  config.regimes = {"four_turns": {}, "eight_turns": {"n_turns": 8}}
  # Regimes to run now (None: all), e.g. --config.run_regimes="('four_turns',)"; a later run
  # with more resumes the finished runs.
  config.run_regimes = ml_collections.config_dict.placeholder(tuple)
  config.seeds = [0, 1, 2, 3, 4]
  config.updates = 150  # J(pi) after 0, measure_every, ..., updates updates
  config.measure_every = 15
  if preset == "along_turns":
    config.regimes = ALONG_TURNS
  if preset == "along_turns_cpu":
    config.regimes = {k: v for k, v in ALONG_TURNS.items() if v["n_turns"] <= 64}
    config.estimators = {k: v for k, v in ESTIMATORS.items() if "k" not in v}
    config.seeds = [0, 1, 2]
    train.rl.prompts_per_step = 8
  if preset == "smoke":
    train.task.train_size = 64
    train.rl.prompts_per_step, train.rl.group_size = 2, 4
    config.estimators = {name: ESTIMATORS[name] for name in ("grpo", "turn_baseline")}
    config.seeds = [0]
    config.updates, config.measure_every = 1, 1
  config.train = train
  return config
