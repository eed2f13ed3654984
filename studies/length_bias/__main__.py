"""Runs the study:

  python -m studies.length_bias --config studies/length_bias/configs.py:<preset> --workdir DIR
"""

from studies.credit_study.runner import cli
from studies.length_bias import runner

if __name__ == "__main__":
  cli(runner.run, "Length-bias config (studies/length_bias/configs.py:<preset>).")
