"""Atomic, resumable checkpoints of the RL stage with orbax.

A checkpoint holds the policy, the frozen reference policy, the optimizer
state and the counters (RL step, global step, generated tokens). The data position and the sampling keys are pure
functions of the step, so restoring these resumes the run exactly.

Faults are reported, never silently absorbed: an unwritable directory fails
before any work, a failed asynchronous save is raised at the next step with
its root cause in one line, and a checkpoint that does not restore
(truncated file, corrupt metadata) is moved aside to `<directory>.corrupt/`
(never deleted) and the previous one is used.
"""

import contextlib
import os
import pathlib
import shutil
import tempfile

import orbax.checkpoint as ocp
from flax import nnx


class CheckpointError(RuntimeError):
  """A checkpoint could not be written or no checkpoint could be restored."""


def root_cause(error: BaseException) -> str:
  """The innermost cause of a chained exception, as `Type: message` on one line."""
  seen = set()
  while id(error) not in seen and (error.__cause__ or error.__context__):
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return f"{type(error).__name__}: {' '.join(str(error).split())}"


def check_writable(directory: pathlib.Path) -> None:
  """Creates `directory` and writes and removes a probe file in it; CheckpointError naming it otherwise."""
  try:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-probe-"):
      pass
  except OSError as error:
    raise CheckpointError(f"{directory} is not writable ({root_cause(error)}); nothing was run.") from None


@contextlib.contextmanager
def _reported(what: str):
  """Re-raises any failure inside as CheckpointError(`what` failed: root cause)."""
  try:
    yield
  except CheckpointError:
    raise
  except Exception as error:
    raise CheckpointError(f"{what} failed: {root_cause(error)}") from None


class Checkpointer:
  """orbax CheckpointManager over {model, optimizer, counters}; keeps the last `keep`."""

  def __init__(self, directory: pathlib.Path, *, keep: int = 2):
    self.directory = pathlib.Path(directory).absolute()
    check_writable(self.directory)
    # Step directories are created synchronously: a failure then raises here
    # instead of leaving orbax's writer threads waiting minutes on a barrier.
    self.manager = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True,
        async_options=ocp.options.AsyncOptions(create_directories_asynchronously=False)))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  @staticmethod
  def _tree(modules: dict, counters: dict) -> dict:
    return {**{name: nnx.state(module) for name, module in modules.items()}, "counters": counters}

  def save(self, rl_step: int, modules: dict, counters: dict) -> None:
    """Saves {name: nnx module or optimizer} and counters asynchronously; orbax
    writes to a temporary directory and renames it when complete. An earlier
    save that failed is raised here (CheckpointError with its root cause)."""
    self.check()
    with _reported(f"saving checkpoint {rl_step} in {self.directory}"):
      self.manager.save(rl_step, args=ocp.args.StandardSave(self._tree(modules, counters)))

  def check(self) -> None:
    """Raises CheckpointError if a finished asynchronous save failed."""
    with _reported(f"a checkpoint save in {self.directory}"):
      self.manager.check_for_errors()

  def restore(self, modules: dict) -> dict:
    """Restores the newest checkpoint that restores into `modules` (in place)
    and returns its counters. A newer one that fails is moved to
    `<directory>.corrupt/<step>` with a message saying why; CheckpointError
    when none restores."""
    target = self._tree(modules, {"rl_step": 0, "step": 0, "gen_tokens": 0})
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(step, args=ocp.args.StandardRestore(target))
      except Exception as error:
        self._set_aside(step, root_cause(error))
        continue
      for name, module in modules.items():
        nnx.update(module, restored[name])
      return {k: int(v) for k, v in restored["counters"].items()}
    raise CheckpointError(f"no checkpoint in {self.directory} could be restored (see above).")

  def _set_aside(self, step: int, reason: str) -> None:
    corrupt = self.directory.with_name(self.directory.name + ".corrupt")
    corrupt.mkdir(exist_ok=True)
    destination = corrupt / str(step)
    if destination.exists():
      destination = corrupt / f"{step}.{os.getpid()}"
    shutil.move(str(self.directory / str(step)), destination)
    print(f"Checkpoint {step} in {self.directory} does not restore ({reason}); moved it to {destination} "
          "and trying the previous one.", flush=True)
    self.manager.reload()

  def wait(self) -> None:
    """Blocks until pending saves finish; CheckpointError if one failed."""
    with _reported(f"a checkpoint save in {self.directory}"):
      self.manager.wait_until_finished()
    self.check()
