"""Atomic, resumable checkpoints of the RL stage with orbax.

A checkpoint holds the policy, the frozen reference policy, the optimizer
state and the counters (RL step, global step, generated tokens). The data
position and the sampling keys are pure functions of the step, so restoring
these resumes the run exactly.

A checkpoint restores onto the current mesh, whatever mesh wrote it: every
array is read with the sharding of the live state it replaces (parameters by
their logical axes, everything else — Adam's count, the counters —
replicated), and a change of device count or mesh shape is logged.

Faults are reported, never silently absorbed: an unwritable directory fails
before any work, a failed asynchronous save is raised at the next step with
its root cause in one line, and a checkpoint that does not restore
(truncated file, corrupt metadata) is moved aside to `<directory>.corrupt/`
(never deleted) and the previous one is used. An intact checkpoint that holds
other state than the run's settings build (a critic added, another model) is a
settings error: refused, naming the differing entries, and nothing is moved.
"""

import contextlib
import math
import os
import pathlib
import shutil
import tempfile

import jax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh

from jaxcredit.models import sharding


class CheckpointError(RuntimeError):
  """A checkpoint could not be written or no checkpoint could be restored."""


def root_cause(error: BaseException) -> str:
  """The innermost cause of a chained exception.

  Args:
    error: an exception.

  Returns:
    ``Type: message`` on one line.
  """
  seen = set()
  while id(error) not in seen and (error.__cause__ or error.__context__):
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return f"{type(error).__name__}: {' '.join(str(error).split())}"


def check_writable(directory: pathlib.Path) -> None:
  """Creates a directory and writes and removes a probe file in it.

  Args:
    directory: the directory.

  Raises:
    CheckpointError: naming it when it is not writable.
  """
  try:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-probe-"):
      pass
  except OSError as error:
    raise CheckpointError(
        f"{directory} is not writable ({root_cause(error)}); nothing was run.") from None


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
  """An orbax CheckpointManager over {model, optimizer, counters}; keeps the last `keep`.

  Args:
    directory: where the step directories go (created and checked writable).
    keep: checkpoints kept.

  Raises:
    CheckpointError: when the directory is not writable.
  """

  def __init__(self, directory: pathlib.Path, *, keep: int = 2):
    self.directory = pathlib.Path(directory).absolute()
    check_writable(self.directory)
    # Step directories are created synchronously: a failure then raises here
    # instead of leaving orbax's writer threads waiting minutes on a barrier.
    self.manager = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True,
        async_options=ocp.options.AsyncOptions(create_directories_asynchronously=False)),
        item_handlers=ocp.StandardCheckpointHandler())  # so a step's metadata reads before restore

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  @staticmethod
  def _tree(modules: dict, counters: dict) -> dict:
    return {**{name: nnx.state(module) for name, module in modules.items()}, "counters": counters}

  def save(self, rl_step: int, modules: dict, counters: dict, mesh: Mesh) -> None:
    """Saves {name: nnx module or optimizer} and counters asynchronously; orbax
    writes to a temporary directory and renames it when complete. The mesh is
    recorded in the step's metadata. An earlier save that failed is raised
    here (CheckpointError with its root cause), and so is a save orbax
    declines (a step not after the latest)."""
    self.check()
    with _reported(f"saving checkpoint {rl_step} in {self.directory}"):
      tree = ocp.args.StandardSave(self._tree(modules, counters))
      started = self.manager.save(rl_step, args=tree, custom_metadata={"mesh": dict(mesh.shape)})
    if not started:  # orbax declines a step at or below its latest
      raise CheckpointError(f"checkpoint {rl_step} was not saved: {self.directory} already holds "
                            f"step {self.latest_step()}.")

  def check(self) -> None:
    """Raises CheckpointError if a finished asynchronous save failed."""
    with _reported(f"a checkpoint save in {self.directory}"):
      self.manager.check_for_errors()

  def restore(self, modules: dict, mesh: Mesh) -> dict:
    """Restores the newest checkpoint that restores into `modules` (in place,
    placed on `mesh` as `on_mesh` says) and returns its counters. A newer one
    that fails is moved to `<directory>.corrupt/<step>` with a message saying
    why; CheckpointError when none restores."""
    target = on_mesh(self._tree(modules, {"rl_step": 0, "step": 0, "gen_tokens": 0}), mesh)
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        saved = self.manager.item_metadata(step).tree
      except Exception as error:
        self._set_aside(step, root_cause(error))
        continue
      check_same_state(saved, target, step=step, directory=self.directory)
      try:
        restored = self.manager.restore(step, args=ocp.args.StandardRestore(target))
        self._report_mesh_change(step, mesh)
      except Exception as error:
        self._set_aside(step, root_cause(error))
        continue
      for name, module in modules.items():
        nnx.update(module, restored[name])
      return {k: int(v) for k, v in restored["counters"].items()}
    raise CheckpointError(f"no checkpoint in {self.directory} could be restored (see above).")

  def _report_mesh_change(self, step: int, mesh: Mesh) -> None:
    saved = (self.manager.metadata(step).custom_metadata or {}).get("mesh")
    if saved and saved != dict(mesh.shape):
      print(f"Checkpoint {step} was written on {describe_mesh(saved)}; resuming on "
            f"{describe_mesh(mesh.shape)}.", flush=True)

  def _set_aside(self, step: int, reason: str) -> None:
    if jax.process_index() != 0:  # every process skips the step; one moves it
      return
    corrupt = self.directory.with_name(self.directory.name + ".corrupt")
    corrupt.mkdir(exist_ok=True)
    destination = corrupt / str(step)
    if destination.exists():
      destination = corrupt / f"{step}.{os.getpid()}"
    shutil.move(str(self.directory / str(step)), destination)
    print(f"Checkpoint {step} in {self.directory} does not restore ({reason}); moved it to "
          f"{destination} and trying the previous one.", flush=True)
    self.manager.reload()

  def wait(self) -> None:
    """Blocks until pending saves finish; CheckpointError if one failed."""
    with _reported(f"a checkpoint save in {self.directory}"):
      self.manager.wait_until_finished()
    self.check()


def _shapes(tree) -> dict[str, tuple]:
  """{"a.b.0": shape} of a tree's leaves (arrays, orbax metadata, Python scalars: ())."""
  part = lambda key: str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))
  return {".".join(map(part, path)): tuple(getattr(leaf, "shape", ()))
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_same_state(saved, target, *, step: int, directory: pathlib.Path) -> None:
  """Refuses, moving nothing, an intact checkpoint that holds other state than this run builds
  (a settings error).

  Args:
    saved: the checkpoint's orbax tree metadata.
    target: the state this run's settings build.
    step: the checkpoint's step.
    directory: the checkpoint directory.

  Raises:
    ValueError: naming the entries missing, unexpected or of another shape.
  """
  saved, target = _shapes(saved), _shapes(target)
  listed = lambda names: ", ".join(names[:6]) + (f" (and {len(names) - 6} more)"
                                                 if len(names) > 6 else "")
  problems = [
      f"{what}: {listed(names)}" for what, names in (
          ("not in the checkpoint", sorted(set(target) - set(saved))),
          ("in the checkpoint only", sorted(set(saved) - set(target))),
          ("of other shapes", [f"{k} {saved[k]} -> {target[k]}"
                               for k in sorted(set(saved) & set(target))
                               if saved[k] != target[k]])) if names]
  if problems:
    raise ValueError(
        f"Checkpoint {step} in {directory} is intact but holds other state than these settings "
        f"build ({'; '.join(problems)}): resume it with the settings that wrote it (a critic, "
        "model, optimizer or staleness setting differs), or start in a new workdir. Nothing was "
        "moved.")


def describe_mesh(shape) -> str:
  """A mesh's device count and its axes over 1.

  Args:
    shape: ``{axis: size}``.

  Returns:
    e.g. '8 devices (data=8)' for ``{'data': 8, 'fsdp': 1, 'model': 1}``.

  Examples:
    >>> from jaxcredit.train import checkpoints
    >>> checkpoints.describe_mesh({"data": 4, "fsdp": 2, "model": 1})
    '8 devices (data=4, fsdp=2)'
  """
  devices = math.prod(shape.values())
  axes = ", ".join(f"{name}={size}" for name, size in shape.items() if size > 1)
  return f"{devices} device{'s' * (devices != 1)}" + (f" ({axes})" if axes else "")


def on_mesh(tree, mesh: Mesh):
  """Abstract restore targets on a mesh.

  Each array keeps its NamedSharding when it has one on `mesh` and is replicated otherwise
  (`sharding.sharding_on`; an array left on one device, restored there, would be committed
  to it and clash with the sharded parameters). Python scalars are left as they are.

  Args:
    tree: a pytree of arrays and scalars.
    mesh: the device mesh.

  Returns:
    the tree with `jax.ShapeDtypeStruct` leaves in place of arrays.
  """

  def target(x):
    if not isinstance(x, jax.Array):
      return x
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding.sharding_on(x, mesh))

  return jax.tree.map(target, tree)
