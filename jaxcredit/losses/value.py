"""Critic and entropy terms."""

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, masked_mean, sanitise
from jaxcredit.losses.aggregation import aggregate


def value_loss(
    values: Array,
    old_values: Array,
    returns: Array,
    mask: Array,
    *,
    clip: float | None = 0.2,
    aggregation: str = "token-mean",
) -> tuple[Array, dict[str, Array]]:
  """Clipped value loss (PPO2, as in OpenAI baselines, TRL and verl)::

    v_clip = old_values + clip(values - old_values, -clip, clip)
    l_t    = 0.5 * max((values - R)^2, (v_clip - R)^2)

  and ``0.5 (values - R)^2`` with clip=None.

  Args:
    values: ``[B, T]`` the critic's current values.
    old_values: ``[B, T]`` its values when the rollout was scored.
    returns: ``[B, T]`` value targets R.
    mask: ``[B, T]`` policy actions.
    clip: the value clip, >= 0, or None.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and clipfrac (the clipped branch is larger),
    value_mean and mse (the unclipped squared error).

  Raises:
    ValueError: on mismatched shapes, clip < 0 or an unknown aggregation.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> loss, metrics = losses.value_loss(jnp.array([[1.0]]), jnp.array([[0.0]]),
    ...                                   jnp.array([[1.0]]), jnp.ones((1, 1), bool), clip=0.5)
    >>> float(loss), float(metrics["clipfrac"])  # the clipped value 0.5 misses by 0.5
    (0.125, 1.0)
  """
  _checks.check_token_and_seq(
      {"values": values, "old_values": old_values, "returns": returns, "mask": mask}, {}
  )
  valid = as_bool(mask)
  values, old_values, returns = (sanitise(x, valid) for x in (values, old_values, returns))
  error = (values - returns) ** 2
  if clip is None:
    loss_tok, clipped_larger = error, jnp.zeros_like(valid)
  else:
    _checks.check_in_range(clip, "clip", low=0.0)
    clipped_values = old_values + jnp.clip(values - old_values, -clip, clip)
    clipped_error = (clipped_values - returns) ** 2
    loss_tok, clipped_larger = jnp.maximum(error, clipped_error), clipped_error > error
  metrics = {
      "clipfrac": masked_mean(clipped_larger.astype(jnp.float32), valid),
      "value_mean": masked_mean(values, valid),
      "mse": masked_mean(error, valid),
  }
  return aggregate(0.5 * loss_tok, valid, aggregation), metrics


def entropy_bonus(
    entropy: Array, mask: Array, *, aggregation: str = "token-mean"
) -> tuple[Array, dict[str, Array]]:
  """``loss = -aggregate(entropy)``: minimising it raises the policy's entropy.

  Scale it with a coefficient when combining.

  Args:
    entropy: ``[B, T]`` the policy's entropy at each token.
    mask: ``[B, T]`` policy actions.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and entropy (token mean over valid tokens).

  Raises:
    ValueError: on mismatched shapes or an unknown aggregation.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> loss, metrics = losses.entropy_bonus(jnp.array([[1.0, 3.0]]), jnp.ones((1, 2), bool))
    >>> float(loss), float(metrics["entropy"])
    (-2.0, 2.0)
  """
  _checks.check_token_and_seq({"entropy": entropy, "mask": mask}, {})
  valid = as_bool(mask)
  entropy = sanitise(entropy, valid)
  return -aggregate(entropy, valid, aggregation), {"entropy": masked_mean(entropy, valid)}
