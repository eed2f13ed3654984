"""Zero-signal diagnostics: how much of a batch carries no learning signal."""

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, masked_mean, sanitise


def signal_diagnostics(
    rewards: Array, advantages: Array, mask: Array, *, group_size: int, tol: float = 0.0
) -> dict[str, Array]:
  """Where a batch's credit is zero (the DAPO "dynamic sampling" question).

  Args:
    rewards: ``[B]`` outcome rewards, groups of `group_size` contiguous rows.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    group_size: responses per prompt.
    tol: an advantage counts as zero when ``abs(A) <= tol``.

  Returns:
    A dict of float32 arrays, 0 for a batch without valid tokens:
    ``zero_variance_groups``, the fraction of groups whose G rewards are all equal (group
    baselines give them no signal); ``zero_advantage_tokens``, the fraction of valid tokens
    with ``abs(A) <= tol``; ``advantage_mass`` ``[B]``, the sum of ``abs(A)`` over each
    response's valid tokens; ``advantage_mass_mean``, its mean over responses.

  Raises:
    ValueError: on mismatched shapes or a batch that `group_size` does not divide.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> rewards = jnp.array([1.0, 0.0, 1.0, 1.0])
    >>> sequence = estimators.grpo_advantages(rewards, group_size=2)
    >>> advantages = jnp.repeat(sequence[:, None], 3, axis=1)
    >>> diagnostics = estimators.signal_diagnostics(rewards, advantages, jnp.ones((4, 3), bool),
    ...                                             group_size=2)
    >>> float(diagnostics["zero_variance_groups"])
    0.5
  """
  _checks.check_token_and_seq({"advantages": advantages, "mask": mask}, {"rewards": rewards})
  _checks.check_group_size(rewards.shape[0], group_size)
  valid = as_bool(mask)
  grouped = rewards.astype(jnp.float32).reshape(-1, group_size)
  zero_variance = jnp.all(grouped == grouped[:, :1], axis=1)
  magnitude = jnp.abs(sanitise(advantages, valid))
  mass = jnp.sum(jnp.where(valid, magnitude, 0.0), axis=1)
  return {
      "zero_variance_groups": jnp.mean(zero_variance.astype(jnp.float32)),
      "zero_advantage_tokens": masked_mean((magnitude <= tol).astype(jnp.float32), valid),
      "advantage_mass": mass,
      "advantage_mass_mean": jnp.mean(mass),
  }
