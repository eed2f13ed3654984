"""Runs the study:

  python -m studies.tree_credit --config studies/tree_credit/configs.py:<preset> --workdir DIR
"""

from studies.credit_study.runner import cli
from studies.tree_credit import runner

if __name__ == "__main__":
  cli(runner.run, "Tree credit config (studies/tree_credit/configs.py:<preset>).")
