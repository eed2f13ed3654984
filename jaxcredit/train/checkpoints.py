"""Atomic, resumable checkpoints of the RL stage with orbax.

A checkpoint holds the policy, the frozen reference policy, the optimizer
state and the counters (RL step, global step, generated tokens). The data position and the sampling keys are pure
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
  def _tree(modules: dict, counters: dict) -> dict:
    return {**{name: nnx.state(module) for name, module in modules.items()}, "counters": counters}

  def save(self, rl_step: int, modules: dict, counters: dict) -> None:
    """Saves {name: nnx module or optimizer} and counters asynchronously; orbax
    writes to a temporary directory and renames it when complete."""
    self.manager.save(rl_step, args=ocp.args.StandardSave(self._tree(modules, counters)))

  def restore(self, modules: dict) -> dict:
    """Restores the latest checkpoint into `modules` in place; returns its counters."""
    target = self._tree(modules, {"rl_step": 0, "step": 0, "gen_tokens": 0})
    restored = self.manager.restore(self.manager.latest_step(), args=ocp.args.StandardRestore(target))
    for name, module in modules.items():
      nnx.update(module, restored[name])
    return {k: int(v) for k, v in restored["counters"].items()}

  def wait(self) -> None:
    self.manager.wait_until_finished()
