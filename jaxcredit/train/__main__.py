"""python -m jaxcredit.train --config experiments/quickstart.py [--config.key=value ...] \
    --workdir DIR"""

import difflib
import runpy
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from jaxcredit.train import checkpoints, loop, workdir_lock

_CONFIG = config_flags.DEFINE_config_file("config", None,
                                          "Experiment config file (experiments/*.py).")
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "Directory for metrics.jsonl, config.json and data.")
flags.mark_flags_as_required(["config", "workdir"])


def unknown_field(config, path: str) -> str | None:
  """A message naming the first part of the dotted `path` that `config` lacks
  (with the closest field names), or None when the path exists."""
  node, walked = config, []
  for part in path.split("."):
    fields = list(node.keys()) if hasattr(node, "keys") else []
    if part not in fields:
      prefix = ".".join(walked)
      close = difflib.get_close_matches(part, fields, n=3)
      suggestions = " or ".join(".".join([*walked, c]) for c in close)
      hint = f" (did you mean {suggestions}?)" if close else ""
      where = f"config.{prefix}" if prefix else "the config"
      known = ", ".join(sorted(fields)) or "no fields"
      return f"unknown config field {path}{hint}; {where} has: {known}."
    node, walked = node[part], [*walked, part]
  return None


def _parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with one clear line for an override of a field the
  config does not have (ml_collections raises two chained tracebacks)."""
  try:
    return flags.FLAGS(argv)
  except Exception as error:  # noqa: BLE001 - explained in one line below
    config = _config_file_defaults(argv)
    for arg in argv[1:]:
      if arg.startswith("--config.") and config is not None:
        message = unknown_field(config, arg.removeprefix("--config.").split("=", 1)[0])
        if message:
          sys.exit(f"Error: {message}")
    sys.exit(f"Error: {checkpoints.root_cause(error)}")


def _config_file_defaults(argv: list[str]):
  """get_config() of the --config file (`path[:argument]`), or None if it cannot be loaded."""
  specs = [b for a, b in zip(argv, argv[1:]) if a == "--config"]
  specs += [a.removeprefix("--config=") for a in argv if a.startswith("--config=")]
  if not specs:
    return None
  path, _, argument = specs[-1].partition(":")
  try:
    get_config = runpy.run_path(path)["get_config"]
    return get_config(argument) if argument else get_config()
  except Exception:  # noqa: BLE001 - the parse error itself is reported instead
    return None


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # keep orbax's per-save INFO lines out of the console
  try:
    final = loop.run(_CONFIG.value, _WORKDIR.value)
  except (FloatingPointError, checkpoints.CheckpointError, workdir_lock.WorkdirBusy,
          ValueError) as error:
    raise SystemExit(f"Stopped: {error}") from error
  print(f"final: {final}")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
