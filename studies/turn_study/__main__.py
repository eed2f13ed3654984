"""Runs the study:

  python -m studies.turn_study --config studies/turn_study/configs.py:<preset> --workdir DIR
"""

from studies.credit_study.runner import cli
from studies.turn_study import runner

if __name__ == "__main__":
  cli(runner.run, "Turn study config (studies/turn_study/configs.py:<preset>).")
