"""Zero-signal diagnostics: how much of a batch carries no learning signal."""

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, masked_mean, sanitise


def signal_diagnostics(
    rewards: Array, advantages: Array, mask: Array, *, group_size: int, tol: float = 0.0
) -> dict[str, Array]:
  """Where a batch's credit is zero (the DAPO "dynamic sampling" question).

  rewards: [B] outcome rewards; advantages, mask: [B, T].
  Returns
    zero_variance_groups   fraction of groups whose G rewards are all equal
                           (group baselines give them no signal)
    zero_advantage_tokens  fraction of valid tokens with |A| <= tol
    advantage_mass         [B] sum over valid tokens of |A| per response
    advantage_mass_mean    its mean over responses
  All float32; 0 for an empty batch of valid tokens.
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
