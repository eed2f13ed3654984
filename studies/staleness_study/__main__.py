"""Runs the study:

  python -m studies.staleness_study --config studies/staleness_study/configs.py:<preset> \\
      --workdir DIR
"""

from studies.credit_study.runner import cli
from studies.staleness_study import runner

if __name__ == "__main__":
  cli(runner.run, "Staleness study config (studies/staleness_study/configs.py:<preset>).")
