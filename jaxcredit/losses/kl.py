"""Per-token KL estimators between the policy and a reference policy."""

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks

KL_KINDS = ("k1", "k2", "k3")


def kl_penalty(logp: Array, ref_logp: Array, *, kind: str) -> Array:
  """Monte-Carlo estimators of KL(pi || ref) from sampled tokens (Schulman, 2020).

  With d = logp - ref_logp:  k1 = d,  k2 = d^2 / 2,  k3 = exp(-d) + d - 1.
  k1 is unbiased, k3 unbiased and non-negative, k2 biased with low variance.
  logp, ref_logp: [B, T] (any equal shapes). Returns float32 of that shape.
  """
  _checks.check_same_shape(logp=logp, ref_logp=ref_logp)
  _checks.check_choice(kind, KL_KINDS, "KL kind")
  d = logp.astype(jnp.float32) - ref_logp.astype(jnp.float32)
  if kind == "k1":
    return d
  if kind == "k2":
    return 0.5 * d**2
  return jnp.exp(-d) + d - 1.0
