"""Shared loader for experiment files that start from the quickstart config."""

import importlib.util
import pathlib


def quickstart_config():
  """The quickstart ConfigDict (experiments/quickstart.py), to be overridden."""
  path = pathlib.Path(__file__).with_name("quickstart.py")
  spec = importlib.util.spec_from_file_location("jaxcredit_experiments_quickstart", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()
