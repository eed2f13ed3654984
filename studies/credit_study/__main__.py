"""Runs the study:

  python -m studies.credit_study --config studies/credit_study/configs.py:<preset> --workdir DIR
"""

from studies.credit_study import runner, sweep


def run_any(study, workdir: str):
  """The sweep for a config with `regimes`, else the first design's `runner.run`."""
  if "regimes" in study:
    return sweep.run(study, workdir)
  return runner.run(study, workdir)


if __name__ == "__main__":
  runner.cli(run_any, "Study config (studies/credit_study/configs.py:<preset>, or "
             "studies/credit_study/configs_v1.py:<preset>).")
