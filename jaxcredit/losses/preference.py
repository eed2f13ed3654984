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
  """Direct Preference Optimisation::

    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    L      = mean(-log sigmoid(beta * margin)) = mean(softplus(-beta * margin))

  Args:
    policy_chosen: ``[B]`` summed log-probs of the chosen responses under the policy.
    policy_rejected: ``[B]`` the same for the rejected responses.
    ref_chosen: ``[B]`` summed log-probs of the chosen responses under the reference.
    ref_rejected: ``[B]`` the same for the rejected responses.
    beta: the implicit reward's scale, > 0.

  Returns:
    ``(loss, metrics)``: a float32 scalar, and reward_accuracy (margin > 0), margin,
    chosen_reward and rejected_reward (beta * log-ratio to the reference).

  Raises:
    ValueError: on a rank other than 1, mismatched shapes or beta <= 0.

  References:
    Rafailov et al., 2023, "Direct Preference Optimization: Your Language Model is Secretly
    a Reward Model", arXiv 2305.18290.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> zero = jnp.zeros(2)
    >>> loss, metrics = losses.dpo_loss(zero, zero, zero, zero)
    >>> round(float(loss), 4)  # log 2 at a zero margin
    0.6931
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
  """Identity Preference Optimisation::

    h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    L = mean((h - 1 / (2 beta))^2)

  on sequence log-probs (sums, or means for length-normalised IPO).

  Args:
    policy_chosen: ``[B]`` summed log-probs of the chosen responses under the policy.
    policy_rejected: ``[B]`` the same for the rejected responses.
    ref_chosen: ``[B]`` summed log-probs of the chosen responses under the reference.
    ref_rejected: ``[B]`` the same for the rejected responses.
    beta: the implicit reward's scale, > 0.

  Returns:
    ``(loss, metrics)``: a float32 scalar, and reward_accuracy (margin > 0), margin,
    chosen_reward and rejected_reward (beta * log-ratio to the reference).

  Raises:
    ValueError: on a rank other than 1, mismatched shapes or beta <= 0.

  References:
    Azar et al., 2023, "A General Theoretical Paradigm to Understand Learning from Human
    Preferences", arXiv 2310.12036.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> zero = jnp.zeros(2)
    >>> loss, _ = losses.ipo_loss(zero, zero, zero, zero, beta=0.5)
    >>> float(loss)  # (0 - 1 / (2 beta))^2
    1.0
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
  """SimPO: reference-free, length-normalised::

    L = mean(-log sigmoid(beta * pc / |yc| - beta * pr / |yr| - gamma))

  with summed log-probs pc, pr and response lengths |y| (a length of 0 gives a reward of 0).

  Args:
    policy_chosen: ``[B]`` summed log-probs of the chosen responses.
    policy_rejected: ``[B]`` summed log-probs of the rejected responses.
    chosen_lengths: ``[B]`` the chosen responses' lengths in tokens.
    rejected_lengths: ``[B]`` the rejected responses' lengths in tokens.
    beta: the reward's scale, > 0.
    gamma: the target reward margin, >= 0.

  Returns:
    ``(loss, metrics)``: a float32 scalar, and reward_accuracy, margin, chosen_reward and
    rejected_reward.

  Raises:
    ValueError: on a rank other than 1, mismatched shapes, beta <= 0 or gamma < 0.

  References:
    Meng et al., 2024, "SimPO: Simple Preference Optimization with a Reference-Free Reward",
    arXiv 2405.14734.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> loss, metrics = losses.simpo_loss(jnp.array([-2.0]), jnp.array([-6.0]), jnp.array([2]),
    ...                                    jnp.array([3]), beta=1.0, gamma=0.0)
    >>> round(float(loss), 4), float(metrics["margin"])
    (0.3133, 1.0)
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
