"""GRPO's gradient at the start of training across T, G and filler entropy
(studies.start_gradients): the credit study's key_token regimes, measured before any
update.

  python -m studies.start_gradients \
      --config studies/start_gradients/configs.py:smoke --workdir DIR
  python -m studies.start_gradients \
      --config studies/start_gradients/configs.py:t_axis --workdir DIR

t_axis: uniform and peaked filler at T = 24, 96 and 384 (the full preset's regimes, whose
training at T = 96 and 384 needs an accelerator) and middling filler at T = 24, at every G,
10 seeds: how GRPO's filler gradient scales with T, G and filler entropy.
"""

import ml_collections

from studies.credit_study import configs as credit_study_configs

PRESETS = ("smoke", "t_axis")


def get_config(preset: str = "t_axis") -> ml_collections.ConfigDict:
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r}; known: {', '.join(PRESETS)}.")
  if preset == "smoke":
    config = credit_study_configs.get_config("smoke")
    short = config.regimes.uniform_filler.task.to_dict()
    config.regimes.uniform_filler_T12 = {"task": {**short, "length": 12}}
    config.run_regimes = None
  else:
    config = credit_study_configs.get_config("full")
    config.run_regimes = (
      "uniform_filler",
      "uniform_filler_T96",
      "uniform_filler_T384",
      "peaked_filler",
      "peaked_filler_T96",
      "peaked_filler_T384",
      "mid_filler",
    )
    config.seeds = list(range(10))
    # One seed per program: at T = 384, G = 32 (256 responses of 388 tokens) XLA's memory
    # analysis of the compiled program gives 7.2 GiB of temporaries per seed.
    config.runs_per_program = 1
  config.report_only = False  # True: the report from the cells measured, nothing measured
  config.preset = f"start_gradients:{preset}"
  return config
