"""Reading a run's per-token export (`jaxcredit.train.export`) back, file by file.

  steps, problems = read_export(workdir)
  workdirs = runs_with_exports(study_dir)

Each readable WORKDIR/tokens/step_*.parquet gives one `Step`; a file that cannot be used
(cut off mid-write, another schema version, columns missing) is skipped with a problem
naming the file, so the rest still shows. The viewer imports nothing of training: the files
are the contract (the schema in docs/guides/viewer.md; tests check both sides agree).
"""

import dataclasses
import json
import pathlib

import numpy as np

DIRECTORY = "tokens"  # WORKDIR/tokens/step_<step>.parquet
SCHEMA_VERSION = 1
REQUIRED = ("step", "rl_step", "group", "sample", "position", "token_id", "token", "is_action",
            "reward", "behaviour_logprob", "logprob", "entropy", "ratio", "advantage")


@dataclasses.dataclass(frozen=True)
class Step:
  """One exported step.

  Attributes:
    path: its Parquet file.
    columns: numpy columns, one entry per token, ordered by group, sample, position.
    estimator: the run's estimator label.
    credit_columns: "advantage", then "advantage.<name>" of each compared estimator.
  """

  path: pathlib.Path
  columns: dict
  estimator: str
  credit_columns: tuple[str, ...]  # "advantage", then "advantage.<name>" ...

  @property
  def step(self) -> int:
    return int(self.columns["step"][0])

  @property
  def rl_step(self) -> int:
    return int(self.columns["rl_step"][0])


class NoExport(FileNotFoundError):
  """The workdir holds no per-token export."""


def read_export(workdir: pathlib.Path) -> tuple[list[Step], list[str]]:
  """A run's per-token export, every readable step file of WORKDIR/tokens.

  Args:
    workdir: the run's directory.

  Returns:
    ``(steps, problems)``: the readable `Step` in step order, and a message for every file
    skipped.

  Raises:
    NoExport: when WORKDIR/tokens holds no step file.
  """
  directory = pathlib.Path(workdir) / DIRECTORY
  paths = sorted(directory.glob("step_*.parquet"))
  if not paths:
    raise NoExport(f"No per-token export in {directory}: train with --config.export.every=N "
                   "(N > 0) to write one.")
  steps, problems = [], []
  for path in paths:
    try:
      steps.append(read_step(path))
    except ValueError as error:
      problems.append(f"Skipped {path}: {error}")
  return steps, problems


def runs_with_exports(directory: pathlib.Path) -> list[pathlib.Path]:
  """The run directories at or below a directory holding an export (a study's runs/...).

  Args:
    directory: where to look.

  Returns:
    the run directories, sorted.
  """
  found = {path.parent.parent for path in pathlib.Path(directory).rglob(
      f"{DIRECTORY}/step_*.parquet")}
  return sorted(found)


def read_step(path: pathlib.Path) -> Step:
  """One export file.

  Args:
    path: a ``step_*.parquet`` file.

  Returns:
    the `Step`.

  Raises:
    ValueError: saying what is wrong with the file (unreadable, another schema version,
      missing columns).
  """
  import pyarrow.parquet as pq  # tensorflow-datasets depends on it; jaxcredit[view] names it

  try:
    table = pq.read_table(path)
  except Exception as error:  # pyarrow raises several types for a truncated or foreign file
    raise ValueError(f"not a readable Parquet file (cut off mid-write?): {error}") from None
  metadata = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
  version = metadata.get("jaxcredit.schema")
  if version != str(SCHEMA_VERSION):
    raise ValueError(f"export schema {version or 'unknown'}, this viewer reads schema "
                     f"{SCHEMA_VERSION}; re-export with this version of jaxcredit.")
  missing = [name for name in REQUIRED if name not in table.column_names]
  if missing:
    raise ValueError(f"columns missing: {', '.join(missing)}.")
  if table.num_rows == 0:
    raise ValueError("no tokens.")
  columns = {name: table.column(name).to_numpy(zero_copy_only=False)
             for name in table.column_names}
  order = np.lexsort((columns["position"], columns["sample"], columns["group"]))
  columns = {name: np.asarray(values)[order] for name, values in columns.items()}
  credit = tuple(name for name in table.column_names
                 if name == "advantage" or name.startswith("advantage."))
  estimator = metadata.get("estimator", "")
  try:
    estimator = _estimator_label(json.loads(estimator))
  except json.JSONDecodeError:
    pass
  return Step(path, columns, estimator, credit)


def _estimator_label(config) -> str:
  if isinstance(config, dict) and set(config) == {"name"}:
    return config["name"]
  return config if isinstance(config, str) else json.dumps(config)
