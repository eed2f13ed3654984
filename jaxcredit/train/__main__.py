"""python -m jaxcredit.train --config experiments/quickstart.py [--config.key=value ...] \
    --workdir DIR

`--help` (with or without --config FILE; default experiments/quickstart.py) lists every
`--config.<field>` override of that config with its default and meaning."""

import difflib
import io
import pathlib
import re
import runpy
import sys
import tokenize

from absl import app, flags, logging
from ml_collections import config_flags

from jaxcredit.train import base_config, checkpoints, loop, workdir_lock

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


HELP_FLAGS = ("--help", "-h", "--helpshort", "-?")
DEFAULT_CONFIG = "experiments/quickstart.py"


def field_comments(*sources: str) -> dict[str, str]:
  """{dotted config field: its comment} from config files' source: the comment ending a
  `config.a.b = ...` line, else the comment lines just above it. Names bound as
  `rl = config.rl` are resolved."""
  comments, aliases = {}, {"config": ""}
  for source in sources:
    trailing, lines = {}, source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
      if token.type == tokenize.COMMENT:
        trailing[token.start[0]] = (token.start[1], token.string.lstrip("#").strip())
    above = []
    for number, line in enumerate(lines, start=1):
      column, comment = trailing.get(number, (len(line), None))
      code = line[:column].strip()
      if not code:
        above = [*above, comment] if comment else []
        continue
      alias = re.fullmatch(r"(\w+) = config\.(\w+)", code)
      field = re.match(r"(\w+)\.([\w.]+) = ", code)
      if alias:
        aliases[alias[1]] = alias[2] + "."
      elif field and field[1] in aliases and (comment or above):
        comments[aliases[field[1]] + field[2]] = comment or " ".join(above)
      above = []
  return comments


def config_help(spec: str) -> str:
  """The `--config.<field>=default  meaning` lines of the config file `spec` (path[:argument])."""
  path, _, argument = spec.partition(":")
  get_config = runpy.run_path(path)["get_config"]
  config = get_config(argument) if argument else get_config()
  comments = field_comments(pathlib.Path(base_config.__file__).read_text(),
                            pathlib.Path(path).read_text())

  def leaves(node, prefix=""):
    for key, value in node.items():
      if hasattr(value, "items") and value and not isinstance(value, dict):
        yield from leaves(value, f"{prefix}{key}.")
      else:
        yield f"{prefix}{key}", value

  lines = [f"Config fields of {spec} (override with --config.<field>=value):"]
  for field, default in leaves(config):
    parents = [field.rsplit(".", n)[0] for n in range(field.count(".") + 1)]
    meaning = next((comments[p] for p in parents if p in comments), "")  # else its parent's
    lines.append(f"  --config.{field}={default!r}" + (f"\n      {meaning}" if meaning else ""))
  return "\n".join(lines)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with one clear line for an override of a field the
  config does not have (ml_collections raises two chained tracebacks); --help
  lists the config's fields."""
  if any(arg in HELP_FLAGS for arg in argv[1:]):
    specs = _config_specs(argv)
    print(__doc__)
    print(config_help(specs[-1] if specs else DEFAULT_CONFIG))
    sys.exit(0)
  try:
    return flags.FLAGS(argv)
  except Exception as error:  # noqa: BLE001 - explained in one line below
    config = _config_file_defaults(argv)
    for arg in argv[1:]:
      if arg.startswith("--config.") and config is not None:
        message = unknown_field(config, arg.removeprefix("--config.").split("=", 1)[0])
        message = message or wrong_type(config, arg)
        if message:
          sys.exit(f"Error: {message}")
    sys.exit(f"Error: {checkpoints.root_cause(error)}")


def wrong_type(config, override: str) -> str | None:
  """A message naming the field when `--config.path=value` cannot be read as the type of
  the field's default (an int, float or bool), or None."""
  path, _, value = override.removeprefix("--config.").partition("=")
  default = config
  for part in path.split("."):
    default = default[part]
  kind = type(default)
  readers = {bool: ("a bool", lambda v: {"true": True, "false": False}[v.lower()]),
             int: ("an int", int), float: ("a float", float)}
  if kind not in readers:
    return None
  name, read = readers[kind]
  try:
    read(value)
  except (KeyError, ValueError):
    return f"--config.{path}={value}: config.{path} takes {name} (default {default!r})."
  return None


def _config_specs(argv: list[str]) -> list[str]:
  """The --config file arguments of `argv` (`path[:argument]`), in order."""
  specs = [b for a, b in zip(argv, argv[1:]) if a == "--config"]
  return specs + [a.removeprefix("--config=") for a in argv if a.startswith("--config=")]


def _config_file_defaults(argv: list[str]):
  """get_config() of the --config file (`path[:argument]`), or None if it cannot be loaded."""
  specs = _config_specs(argv)
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
