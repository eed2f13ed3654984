"""Overlapped sampling and learning on disjoint devices (`mesh.sampler_shape`, `rl.sync_every`).

The devices are split into a learner mesh (`mesh.shape`, the first devices) and a
sampler mesh (`mesh.sampler_shape`, the rest; `sharding.split_meshes`). The sampler
holds its own copy of the policy's parameters. The loop dispatches update t and then
samples batch t + 1: JAX dispatches both asynchronously, so they run at the same
time, each on its own devices, and the host scores batch t + 1 while the learner
still computes. Every `sync_every` updates the learner's parameters are copied onto
the sampler's devices with `jax.device_put` (device to device, no host round trip).

Batch t is therefore sampled with the parameters after update t - lag,

  lag = 0 for t = 0,   lag = ((t - 1) mod sync_every) + 1 after,

the "periodic" mode of `jaxcredit.train.staleness`: a one-mesh run with
rl.max_staleness = sync_every and rl.staleness_mode = "periodic" computes the same
batches and updates.
"""

import dataclasses

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxcredit.models import sharding
from jaxcredit.rollout import Rollout
from jaxcredit.rollout_sources import SingleTurn
from jaxcredit.train import staleness


def check_settings(sync_every) -> None:
  """Checks the sampler's synchronisation setting.

  Args:
    sync_every: rl.sync_every.

  Raises:
    ValueError: naming the field unless it is an int >= 1.
  """
  if not isinstance(sync_every, int) or isinstance(sync_every, bool) or sync_every < 1:
    raise ValueError(f"rl.sync_every must be an int >= 1, got {sync_every!r}.")


class Sampler:
  """The sampler's devices, its copy of the policy and the rollout source placed there.

  Args:
    model: the policy (copied onto the sampler's mesh).
    mesh: the sampler's mesh.
    source: the single-turn rollout source.
    sync_every: updates between the sampler's copies of the policy.

  Raises:
    ValueError: unless sync_every is an int >= 1.
  """

  def __init__(self, model: nnx.Module, mesh: Mesh, source: SingleTurn, sync_every: int):
    check_settings(sync_every)
    self.mesh, self.sync_every = mesh, sync_every
    self.model = sharding.shard_model(nnx.clone(model), mesh)
    rows = sharding.batch_sharding(mesh)
    self.source = dataclasses.replace(source, place=lambda x: jax.device_put(x, rows),
                                      local=np.asarray)

  def lag(self, rl_step: int) -> int:
    """The staleness of update `rl_step`'s batch (module docstring)."""
    return staleness.lag(rl_step, self.sync_every, "periodic", seed=0)

  def due(self, rl_step: int) -> bool:
    """Whether the learner's parameters are pushed before update `rl_step` (after every
    `sync_every` updates), so that batch rl_step + 1 is sampled with them."""
    return rl_step % self.sync_every == 0

  def push(self, model: nnx.Module) -> None:
    """The sampler's parameters become `model`'s, copied device to device onto the
    sampler's mesh."""
    nnx.update(self.model, nnx.state(model, nnx.Param))
    sharding.shard_model(self.model, self.mesh)

  def sample(self, batch: dict, key: jax.Array, rl_step: int) -> Rollout:
    """Update rl_step's scored rollout of `batch`, sampled with fold_in(key, rl_step) on
    the sampler's devices (and left there). Everything it computes runs there, the key's
    folding and generate's tables included: an op on a learner device would wait for the
    update in flight."""
    key = jax.device_put(key, NamedSharding(self.mesh, PartitionSpec()))
    with jax.set_mesh(self.mesh), jax.default_device(self.mesh.devices.flat[0]):
      return self.source(self.model, batch, jax.random.fold_in(key, rl_step))
