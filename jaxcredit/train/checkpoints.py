"""Atomic, resumable checkpoints of the RL stage with orbax.

A checkpoint holds the model parameters, the optimizer state and the counters
(RL step, global step). The data position and the sampling keys are pure
functions of the step, so restoring these resumes the run exactly.
"""

import pathlib

import orbax.checkpoint as ocp
from flax import nnx


class Checkpointer:
  """orbax CheckpointManager over {model, optimizer, counters}; keeps the last `keep`."""

  def __init__(self, directory: pathlib.Path, *, keep: int = 2):
    self.manager = ocp.CheckpointManager(
        pathlib.Path(directory).absolute(),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
    )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  @staticmethod
  def _tree(model, optimizer, counters: dict) -> dict:
    return {"model": nnx.state(model), "optimizer": nnx.state(optimizer), "counters": counters}

  def save(self, rl_step: int, model, optimizer, counters: dict) -> None:
    """Saves asynchronously; orbax writes to a temporary directory and renames it."""
    self.manager.save(rl_step, args=ocp.args.StandardSave(self._tree(model, optimizer, counters)))

  def restore(self, model, optimizer) -> dict:
    """Restores the latest checkpoint into model and optimizer in place; returns its counters."""
    step = self.manager.latest_step()
    target = self._tree(model, optimizer, {"rl_step": 0, "step": 0})
    restored = self.manager.restore(step, args=ocp.args.StandardRestore(target))
    nnx.update(model, restored["model"])
    nnx.update(optimizer, restored["optimizer"])
    return {k: int(v) for k, v in restored["counters"].items()}

  def wait(self) -> None:
    self.manager.wait_until_finished()
