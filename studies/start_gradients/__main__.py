"""Runs the study:

  python -m studies.start_gradients --config studies/start_gradients/configs.py:<preset> \\
      --workdir DIR
"""

from studies.credit_study.runner import cli
from studies.start_gradients import runner

if __name__ == "__main__":
  cli(runner.run, "Credit-study config (studies/start_gradients/configs.py:<preset>).")
