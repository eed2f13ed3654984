"""Preference losses on sequence log-probabilities."""

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks


def dpo_loss(
    policy_chosen: Array,
    policy_rejected: Array,
    ref_chosen: Array,
    ref_rejected: Array,
    *,
    beta: float = 0.1,
) -> tuple[Array, dict[str, Array]]:
  """Direct Preference Optimisation (Rafailov et al., 2023).

  Inputs are summed sequence log-probs [B]. With
  margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected):
  L = mean(-log sigmoid(beta * margin)) = mean(softplus(-beta * margin)).
  Metrics: reward_accuracy (margin > 0), margin, chosen_reward and
  rejected_reward (beta * log-ratio to the reference).
  """
  arrays = dict(
      policy_chosen=policy_chosen, policy_rejected=policy_rejected,
      ref_chosen=ref_chosen, ref_rejected=ref_rejected,
  )
  for name, x in arrays.items():
    _checks.check_rank(x, 1, name)
  _checks.check_same_shape(**arrays)
  chosen_reward = beta * (policy_chosen.astype(jnp.float32) - ref_chosen)
  rejected_reward = beta * (policy_rejected.astype(jnp.float32) - ref_rejected)
  logits = chosen_reward - rejected_reward
  metrics = {
      "reward_accuracy": jnp.mean((logits > 0).astype(jnp.float32)),
      "margin": jnp.mean(logits) / beta,
      "chosen_reward": jnp.mean(chosen_reward),
      "rejected_reward": jnp.mean(rejected_reward),
  }
  return jnp.mean(jax.nn.softplus(-logits)), metrics
