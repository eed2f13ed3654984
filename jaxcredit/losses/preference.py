"""Preference losses on sequence log-probabilities."""

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import safe_divide


def _check_sequences(arrays: dict[str, Array]) -> None:
  for name, x in arrays.items():
    _checks.check_rank(x, 1, name)
  _checks.check_same_shape(**arrays)


def _preference_margin(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
  """Log-ratio margin h = (pc - rc) - (pr - rr) [B] and the implicit-reward metrics."""
  _checks.check_in_range(beta, "beta", low=0.0, low_open=True)
  _check_sequences(dict(
      policy_chosen=policy_chosen, policy_rejected=policy_rejected,
      ref_chosen=ref_chosen, ref_rejected=ref_rejected,
  ))
  chosen = policy_chosen.astype(jnp.float32) - ref_chosen
  rejected = policy_rejected.astype(jnp.float32) - ref_rejected
  margin = chosen - rejected
  metrics = {
      "reward_accuracy": jnp.mean((margin > 0).astype(jnp.float32)),
      "margin": jnp.mean(margin),
      "chosen_reward": beta * jnp.mean(chosen),
      "rejected_reward": beta * jnp.mean(rejected),
  }
  return margin, metrics


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
  margin, metrics = _preference_margin(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                                       beta)
  return jnp.mean(jax.nn.softplus(-beta * margin)), metrics


def ipo_loss(
    policy_chosen: Array,
    policy_rejected: Array,
    ref_chosen: Array,
    ref_rejected: Array,
    *,
    beta: float = 0.1,
) -> tuple[Array, dict[str, Array]]:
  """Identity Preference Optimisation (Azar et al., 2023).

  h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected);
  L = mean((h - 1 / (2 beta))^2). Sequence log-probs [B] (sums, or means for
  length-normalised IPO). Metrics as `dpo_loss`.
  """
  margin, metrics = _preference_margin(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                                       beta)
  return jnp.mean((margin - 1.0 / (2.0 * beta)) ** 2), metrics


def simpo_loss(
    policy_chosen: Array,
    policy_rejected: Array,
    chosen_lengths: Array,
    rejected_lengths: Array,
    *,
    beta: float = 2.0,
    gamma: float = 1.0,
) -> tuple[Array, dict[str, Array]]:
  """SimPO (Meng et al., 2024): reference-free, length-normalised.

  L = mean(-log sigmoid(beta * pc / |yc| - beta * pr / |yr| - gamma)), with
  summed log-probs pc, pr and response lengths |y| [B] (a length of 0 gives
  a reward of 0). Metrics: reward_accuracy, margin, chosen_reward, rejected_reward.
  """
  arrays = dict(policy_chosen=policy_chosen, policy_rejected=policy_rejected,
                chosen_lengths=chosen_lengths, rejected_lengths=rejected_lengths)
  _check_sequences(arrays)
  _checks.check_in_range(beta, "beta", low=0.0, low_open=True)
  _checks.check_in_range(gamma, "gamma", low=0.0)
  chosen_reward = beta * safe_divide(policy_chosen.astype(jnp.float32),
                                     chosen_lengths.astype(jnp.float32))
  rejected_reward = beta * safe_divide(policy_rejected.astype(jnp.float32),
                                       rejected_lengths.astype(jnp.float32))
  logits = chosen_reward - rejected_reward - gamma
  metrics = {
      "reward_accuracy": jnp.mean((chosen_reward > rejected_reward).astype(jnp.float32)),
      "margin": jnp.mean(chosen_reward - rejected_reward),
      "chosen_reward": jnp.mean(chosen_reward),
      "rejected_reward": jnp.mean(rejected_reward),
  }
  return jnp.mean(jax.nn.softplus(-logits)), metrics
