"""Stale rollouts with exact semantics (`rl.max_staleness = k`, `rl.staleness_mode`).

The batch of RL update t (0-based: t updates done) is sampled with the policy's
parameters after update t - lag::

  fixed    lag = k
  uniform  lag ~ U{0, ..., k}, drawn from (seed, t) alone
  periodic lag = ((t - 1) mod k) + 1: the lags of a sampler on its own devices that
           samples batch t + 1 during update t and receives the learner's weights
           every k updates (`jaxcredit.train.overlap`; 1, 2, ..., k, 1, 2, ...)

clamped at t (before update k the oldest parameters are the ones RL started from).
The lag used is recorded on every sample (`Rollout.staleness`), the draw depends on
nothing but the seed and t, and the k parameter snapshots are checkpointed with the
run, so a resumed run samples exactly as an uninterrupted one. k = 0 is synchronous
RL: no snapshot is kept and the loop runs as without this module.
"""

import jax
import numpy as np
from flax import nnx

STALENESS_MODES = ("fixed", "uniform", "periodic")
_LAG_STREAM = 7  # folded into the lag draw's seed: its own random stream


def check_settings(max_staleness, mode) -> None:
  """Checks the staleness settings.

  Args:
    max_staleness: rl.max_staleness.
    mode: rl.staleness_mode.

  Raises:
    ValueError: naming the field unless max_staleness is an int >= 0 and mode is one of
      `STALENESS_MODES`.
  """
  if not isinstance(max_staleness, int) or isinstance(max_staleness, bool) or max_staleness < 0:
    raise ValueError(f"rl.max_staleness must be an int >= 0, got {max_staleness!r}.")
  if mode not in STALENESS_MODES:
    raise ValueError(f"rl.staleness_mode must be one of {', '.join(STALENESS_MODES)}, "
                     f"got {mode!r}.")


def lag(rl_step: int, max_staleness: int, mode: str, seed: int) -> int:
  """The staleness of an update's batch: the mode's lag, clamped at rl_step.

  Args:
    rl_step: the update's index.
    max_staleness: rl.max_staleness.
    mode: one of `STALENESS_MODES`.
    seed: the run's seed (the "uniform" mode's draws).

  Returns:
    the lag in updates.

  Examples:
    >>> from jaxcredit.train import staleness
    >>> [staleness.lag(step, 2, "periodic", seed=0) for step in range(5)]
    [0, 1, 2, 1, 2]
  """
  if mode == "fixed":
    lag = max_staleness
  elif mode == "periodic":
    lag = (rl_step - 1) % max_staleness + 1 if max_staleness else 0
  else:
    lag = int(np.random.default_rng([seed, rl_step, _LAG_STREAM]).integers(0, max_staleness + 1))
  return min(lag, rl_step)


class StaleParameters:
  """The policy's parameters after each of the last k updates.

  ``snapshots["stale_j"]`` (j = 1..k) is the policy module as it was j updates ago (at the
  start of RL every snapshot holds the starting parameters).

  Args:
    model: the policy.
    max_staleness: k.
    mode: one of `STALENESS_MODES`.
    seed: the run's seed.

  Raises:
    ValueError: for bad settings (`check_settings`).
  """

  def __init__(self, model: nnx.Module, max_staleness: int, mode: str, seed: int):
    check_settings(max_staleness, mode)
    self.max_staleness, self.mode, self.seed = max_staleness, mode, seed
    self.snapshots = {f"stale_{j}": nnx.clone(model) for j in range(1, max_staleness + 1)}

  def reset(self, model: nnx.Module) -> None:
    """Every snapshot holds the policy's current parameters (the start of RL)."""
    for snapshot in self.snapshots.values():
      nnx.update(snapshot, nnx.state(model))

  def lag(self, rl_step: int) -> int:
    """The staleness of update `rl_step`'s batch (`lag`)."""
    return lag(rl_step, self.max_staleness, self.mode, self.seed)

  def sampler(self, model: nnx.Module, lag: int) -> nnx.Module:
    """The module to sample with at staleness `lag`: the policy itself at 0."""
    return model if lag == 0 else self.snapshots[f"stale_{lag}"]

  def capture(self, model: nnx.Module) -> nnx.State | None:
    """The policy's state by value, before an update (None when k = 0). nnx.state alone
    shares the module's Variables, which the update then overwrites; fresh Variables
    around the same (immutable) arrays do not change, and copy no buffer."""
    return snapshot(nnx.state(model)) if self.max_staleness else None

  def push(self, captured: nnx.State | None) -> None:
    """After an update: every snapshot ages by one and stale_1 becomes `captured`."""
    for j in range(self.max_staleness, 1, -1):
      nnx.update(self.snapshots[f"stale_{j}"], nnx.state(self.snapshots[f"stale_{j - 1}"]))
    if captured is not None:
      nnx.update(self.snapshots["stale_1"], captured)


def snapshot(state: nnx.State) -> nnx.State:
  """A state by value: fresh Variables around the same (immutable) arrays, which later updates
  of the modules do not change (no buffer is copied).

  Args:
    state: an `nnx.State`.

  Returns:
    the snapshot.
  """
  return jax.tree.map(lambda x: x, state)
