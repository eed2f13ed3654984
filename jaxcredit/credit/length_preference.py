"""lambda-GRPO's learnable length preference: the exponent lam of
`estimators.lambda_grpo_weights`, kept across steps and learnt by gradient descent on the
token-mean policy-gradient surrogate it weighs.

At the sampling policy (every ratio 1) lambda-GRPO's loss is::

  L(lam) = -sum_i f_i(lam) A_i l_i / sum_i l_i

with A_i GRPO's advantages, l_i the response lengths and f_i the weights; lam follows
dL/dlam with its own Adam, one step per batch, after the batch's weights are taken with the
lam that came before it (so a batch's credit is a function of earlier batches only).
"""

import jax.numpy as jnp
import optax
from flax import nnx
from jax import Array

from jaxcredit._masking import as_bool
from jaxcredit.estimators import group
from jaxcredit.rollout import Rollout


class LengthPreference(nnx.Module):
  """The preference exponent lam, checkpointed with the policy.

  Args:
    lam: its starting value.

  Attributes:
    lam: the float32 scalar `nnx.Param`.
  """

  def __init__(self, lam: float):
    self.lam = nnx.Param(jnp.asarray(lam, jnp.float32))


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
  advantages = group.lambda_grpo_advantages(rewards, lengths, group_size=group_size, lam=lam,
                                            r=r)
  lengths = lengths.astype(jnp.float32)
  return -jnp.sum(advantages * lengths) / jnp.maximum(jnp.sum(lengths), 1.0)


class LengthPreferenceProvider:
  """rollout.extras["length_weights"] ``[B]``: each response's weight f_i under the current
  lam, then one Adam step of lam on `surrogate`.

  Args:
    lam: lam's starting value.
    r: how far the standardised lengths move h from 1.
    learning_rate: lam's Adam learning rate.

  Raises:
    ValueError: for a learning rate that is not positive.
  """

  def __init__(self, lam: float, r: float, learning_rate: float):
    if not learning_rate > 0.0:
      raise ValueError(f"lambda_grpo_learned's lam_learning_rate must be > 0, got "
                       f"{learning_rate!r}.")
    self.r = r
    self.preference = LengthPreference(lam)
    self.optimizer = nnx.Optimizer(self.preference, optax.adam(learning_rate), wrt=nnx.Param)

  def modules(self) -> dict:
    """{"length_preference", "length_preference_optimizer"}: what a checkpoint keeps."""
    return {"length_preference": self.preference,
            "length_preference_optimizer": self.optimizer}

  def __call__(self, context, rollout: Rollout) -> tuple[dict, dict]:
    del context
    lengths = jnp.sum(as_bool(rollout.mask), axis=1)
    lam = self.preference.lam[...]
    weights = group.lambda_grpo_weights(lengths, group_size=rollout.group_size, lam=lam,
                                        r=self.r)
    loss = lambda preference: surrogate(preference.lam[...], rollout.rewards, lengths,
                                        group_size=rollout.group_size, r=self.r)
    self.optimizer.update(self.preference, nnx.grad(loss)(self.preference))
    return {"length_weights": weights}, {"lambda_grpo/lam": float(lam)}
