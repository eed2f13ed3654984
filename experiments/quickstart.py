"""Quickstart: SFT warm start then GRPO on reversed-answer addition, tiny model, CPU.

The quickstart is the base config as it is: every field, its default and its meaning are in
`jaxcredit/train/base_config.py` (`python -m jaxcredit.train --help` lists them).
"""

import ml_collections

from jaxcredit.train import base_config


def get_config() -> ml_collections.ConfigDict:
  return base_config.get_config()
