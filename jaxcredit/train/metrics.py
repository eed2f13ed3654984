"""Training metrics on disk: `metrics.jsonl` (one strict-JSON object per line,
always with `step`) mirrored to TensorBoard event files."""

import json
import math
import pathlib
import sys
import uuid

from jaxcredit.atomic import write_atomically


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported without torch: its module imports torch, when
  installed, only to accept torch tensors (jaxcredit passes floats), which costs seconds in
  every training process. A torch already imported is used as is."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules["torch"] = None  # `import torch` raises ImportError while this is set
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter


class MetricsWriter:
  """Appends one JSON object per line to workdir/metrics.jsonl (always with `step`) and
  mirrors the scalars to TensorBoard (workdir/tensorboard) and, when given a run
  (`wandb_run`), to Weights & Biases.

  A fresh run moves an earlier run's file aside (metrics.<mtime>.jsonl); a resumed run keeps
  the lines up to the resumed step and appends after them.

  Args:
    workdir: the run's directory.
    resume_step: the step a resumed run restarts from; None for a fresh run.
    primary: this process writes (in a multi-process run only process 0 does; elsewhere
      every method does nothing).
    wandb_run: a Weights & Biases run (`wandb_run`), or None.
  """

  def __init__(self, workdir: pathlib.Path, *, resume_step: int | None = None,
               primary: bool = True, wandb_run=None):
    self.primary = primary
    self.tensorboard = None
    self.wandb_run = wandb_run
    if not primary:
      return
    self.path = workdir / "metrics.jsonl"
    # On resume, TensorBoard drops the events logged after the checkpoint (they are logged again).
    self.tensorboard = _summary_writer_class()(str(workdir / "tensorboard"),
                                     purge_step=None if resume_step is None else resume_step + 1)
    if not self.path.exists():
      return
    if resume_step is None:
      kept = self.path.with_name(f"metrics.{int(self.path.stat().st_mtime)}.jsonl")
      self.path.rename(kept)
      print(f"Kept the previous metrics as {kept}.")
      return
    kept_lines = [
        line for line in _complete_lines(self.path) if json.loads(line)["step"] <= resume_step
    ]
    write_atomically(self.path, lambda tmp: tmp.write_text("".join(kept_lines)))

  def write(self, step: int, metrics: dict) -> None:
    """Appends one line; a NaN or infinite value is written as null (strict JSON)."""
    if not self.primary:
      return
    values = {k: float(v) for k, v in metrics.items()}
    record = {"step": int(step), **{k: v if math.isfinite(v) else None for k, v in values.items()}}
    with open(self.path, "a") as f:
      f.write(json.dumps(record, allow_nan=False) + "\n")
    for name, value in values.items():
      self.tensorboard.add_scalar(name, value, step)
    if self.wandb_run is not None:
      self.wandb_run.log(values, step=int(step))

  def close(self) -> None:
    if self.primary:
      self.tensorboard.close()
      if self.wandb_run is not None:
        self.wandb_run.finish()


def wandb_run(settings, workdir: pathlib.Path, config: dict):
  """The Weights & Biases run of a config, its files under workdir/wandb.

  The run's id is kept in workdir/wandb_run_id, so a resumed training run continues the same
  W&B run.

  Args:
    settings: ``config.wandb`` (project, entity, mode).
    workdir: the run's directory.
    config: the run's config as a dict (logged with the run).

  Returns:
    the ``wandb`` run, or None when no project is named.
  """
  if not settings.project:
    return None
  import wandb  # an optional dependency (refusals.validate_config checks it is installed)

  id_file = workdir / "wandb_run_id"
  run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
  id_file.write_text(run_id)
  return wandb.init(project=settings.project, entity=settings.entity or None, mode=settings.mode,
                    dir=str(workdir), id=run_id, resume="allow", config=config)


def _complete_lines(path: pathlib.Path) -> list[str]:
  """The lines of a JSONL file, dropping (with a warning) a last line cut off
  mid-write by a crash or a full disk."""
  lines = path.read_text(errors="replace").splitlines(keepends=True)
  if lines:
    try:
      json.loads(lines[-1])
    except json.JSONDecodeError:
      print(f"Dropped the incomplete last line of {path} (a write was cut off): {lines[-1][:80]!r}")
      lines = lines[:-1]
  return [line if line.endswith("\n") else line + "\n" for line in lines]
