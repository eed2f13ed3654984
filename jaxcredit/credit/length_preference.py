"""lambda-GRPO's learnable length preference: the exponent lam of
`estimators.lambda_grpo_weights`, kept across steps and learnt by gradient descent on the
token-mean policy-gradient surrogate it weighs.

At the sampling policy (every ratio 1) lambda-GRPO's loss is::

  L(lam) = -sum_i f_i(lam) A_i l_i / sum_i l_i

with A_i GRPO's advantages, l_i the response lengths and f_i the weights; lam follows
dL/dlam with its own Adam, one step per batch, after the batch's weights are taken with the
lam that came before it (so a batch's credit is a function of earlier batches only). The
trainer runs it as a provider (`LengthPreferenceProvider`), the batched lab inside its
program (`update`, traceable).
"""

import jax.numpy as jnp
import optax
from flax import nnx
from jax import Array

from jaxcredit._masking import as_bool
from jaxcredit.estimators import length_aware
from jaxcredit.models import sharding
from jaxcredit.rollout import Rollout


class LengthPreference(nnx.Module):
  """The preference exponent lam, checkpointed with the policy, and its fixed r.

  Args:
    lam: lam's starting value.
    r: how far the standardised lengths move h from 1 (`length_aware.lambda_grpo_weights`).

  Attributes:
    lam: the float32 scalar `nnx.Param`.
    r: the float r.
  """

  def __init__(self, lam: float, r: float):
    self.lam = nnx.Param(jnp.asarray(lam, jnp.float32))
    self.r = float(r)


def modules(lam: float, r: float, learning_rate: float) -> dict:
  """{"length_preference": LengthPreference, "length_preference_optimizer": its Adam}.

  Args:
    lam: lam's starting value.
    r: how far the standardised lengths move h from 1.
    learning_rate: lam's Adam learning rate (> 0).

  Returns:
    the two modules, as a run keeps and checkpoints them.

  Raises:
    ValueError: for a learning rate that is not positive.
  """
  if not learning_rate > 0.0:
    raise ValueError(f"lambda_grpo_learned's lam_learning_rate must be > 0, got "
                     f"{learning_rate!r}.")
  preference = LengthPreference(lam, r)
  return {"length_preference": preference,
          "length_preference_optimizer": nnx.Optimizer(preference, optax.adam(learning_rate),
                                                       wrt=nnx.Param)}


def surrogate(lam: Array, rewards: Array, lengths: Array, *, group_size: int, r: float) -> Array:
  """lambda-GRPO's token-mean loss at the sampling policy (module docstring).

  Args:
    lam: the preference exponent (scalar).
    rewards: ``[B]`` outcome rewards, groups of `group_size` contiguous rows.
    lengths: ``[B]`` response lengths in tokens.
    group_size: G, responses per prompt.
    r: how far the standardised lengths move h from 1.

  Returns:
    the float32 scalar loss; 0 when every response is empty.
  """
  advantages = length_aware.lambda_grpo_advantages(rewards, lengths, group_size=group_size,
                                                   lam=lam, r=r)
  lengths = lengths.astype(jnp.float32)
  return -jnp.sum(advantages * lengths) / jnp.maximum(jnp.sum(lengths), 1.0)


def weights(preference: LengthPreference, rollout: Rollout) -> Array:
  """The rollout's length weights under the preference's current lam. Traceable.

  Args:
    preference: the `LengthPreference`.
    rollout: the scored `Rollout` (lengths counted on its mask).

  Returns:
    float32 ``[B]`` weights f_i (`length_aware.lambda_grpo_weights`).
  """
  return length_aware.lambda_grpo_weights(jnp.sum(as_bool(rollout.mask), axis=1),
                                          group_size=rollout.group_size,
                                          lam=preference.lam[...], r=preference.r)


def update(preference: LengthPreference, optimizer: nnx.Optimizer, rollout: Rollout) -> Array:
  """The rollout's length weights under the current lam, then lam's Adam step on
  `surrogate` (in place). Traceable.

  Args:
    preference: the `LengthPreference`.
    optimizer: its `nnx.Optimizer`.
    rollout: the scored `Rollout` (lengths counted on its mask).

  Returns:
    float32 ``[B]`` weights f_i (`length_aware.lambda_grpo_weights` at the lam before the step).
  """
  before = weights(preference, rollout)
  lengths = jnp.sum(as_bool(rollout.mask), axis=1)
  loss = lambda p: surrogate(p.lam[...], rollout.rewards, lengths,
                             group_size=rollout.group_size, r=p.r)
  optimizer.update(preference, nnx.grad(loss)(preference))
  return before


_update_step = sharding.jit_in_place(update)


class LengthPreferenceProvider:
  """rollout.extras["length_weights"] ``[B]``: each response's weight under the current lam,
  then lam's Adam step (`update`, compiled); the trainer's provider.

  Args:
    lam: lam's starting value.
    r: how far the standardised lengths move h from 1.
    learning_rate: lam's Adam learning rate.

  Raises:
    ValueError: for a learning rate that is not positive.
  """

  def __init__(self, lam: float, r: float, learning_rate: float):
    self._modules = modules(lam, r, learning_rate)

  def modules(self) -> dict:
    """{"length_preference", "length_preference_optimizer"}: what a checkpoint keeps."""
    return self._modules

  def __call__(self, context, rollout: Rollout) -> tuple[dict, dict]:
    del context
    preference = self._modules["length_preference"]
    lam = float(preference.lam[...])
    length_weights = _update_step(preference, self._modules["length_preference_optimizer"],
                                  rollout)
    return {"length_weights": length_weights}, {"lambda_grpo/lam": lam}
