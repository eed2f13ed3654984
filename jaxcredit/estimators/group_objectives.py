"""Group advantages for objectives other than the expected reward: pass@k and the log of the
success probability (maximum likelihood RL).

rewards: [B] with `group_size` = G contiguous rows per prompt; B % G == 0.
"""

import jax.numpy as jnp
from jax import Array

from jaxcredit._masking import safe_divide, safe_sqrt
from jaxcredit.estimators.group import _centred, _grouped


def _binomial_ratio(n_top: Array, n_bottom: int, k: int) -> Array:
  """C(n_top, k) / C(n_bottom, k) = prod_{i<k} (n_top - i) / (n_bottom - i), 0 if n_top < k."""
  ratio = jnp.ones_like(n_top)
  for i in range(k):
    ratio = ratio * jnp.maximum(n_top - i, 0.0) / (n_bottom - i)
  return ratio


def pass_at_k_advantages(rewards: Array, *, group_size: int, k: int) -> Array:
  """Analytic pass@k advantages (Chen et al., 2025, "Pass@k Training").

  With N = group_size responses of which N_neg are wrong (reward <= 0)::

    R = 1 - C(N_neg, k) / C(N, k)                (unbiased pass@k of the group)
    s = sqrt(R (1 - R))
    A_correct = (1 - R) / s
    A_wrong   = (1 - R - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / s

  k = 1 recovers GRPO with the population std.

  Args:
    rewards: ``[B]`` binary rewards (correct iff > 0), groups of `group_size` contiguous rows.
    group_size: responses per prompt, N.
    k: the k of pass@k, ``1 <= k <= group_size``.

  Returns:
    float32 ``[B]``; 0 for all-correct or all-wrong groups.

  Raises:
    ValueError: when k is outside ``[1, group_size]`` or `group_size` does not divide B.

  References:
    Chen et al., 2025, "Pass@k Training for Adaptively Balancing Exploration and
    Exploitation of Large Reasoning Models", arXiv 2508.10751.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.pass_at_k_advantages(jnp.array([1.0, 0.0, 0.0, 0.0]), group_size=4, k=2).round(4)
    Array([ 1.    , -0.3333, -0.3333, -0.3333], dtype=float32)
  """
  grouped = _grouped(rewards, group_size)
  if not isinstance(k, int) or not 1 <= k <= group_size:
    raise ValueError(f"k must be an int in [1, group_size={group_size}], got {k!r}.")
  correct = grouped > 0
  n_wrong = jnp.sum(~correct, axis=1, keepdims=True).astype(jnp.float32)
  pass_k = 1.0 - _binomial_ratio(n_wrong, group_size, k)
  std = safe_sqrt(pass_k * (1.0 - pass_k))
  miss_given_wrong = _binomial_ratio(n_wrong - 1.0, group_size - 1, k - 1)
  numerator = jnp.where(correct, 1.0 - pass_k, 1.0 - pass_k - miss_given_wrong)
  return safe_divide(numerator, jnp.broadcast_to(std, numerator.shape)).reshape(-1)


def maxrl_advantages(rewards: Array, *, group_size: int) -> Array:
  """Maximum Likelihood RL: the group's deviation from its mean, relative to the mean::

    A_i = (r_i - mean_g) / mean_g

  With 0/1 rewards the gradient of ``sum_i A_i log pi(y_i)`` is an unbiased estimate of
  ``grad log p(x)`` truncated at order G (p the prompt's success probability), where GRPO's
  is one of ``grad p``: hard prompts (small p) weigh more.

  Args:
    rewards: ``[B]`` rewards in [0, 1] (0/1 correctness), groups of `group_size` contiguous
      rows.
    group_size: G, responses per prompt.

  Returns:
    float32 ``[B]``; 0 for a group whose mean reward is not positive (no success: nothing
    to weigh) and when G == 1.

  Raises:
    ValueError: when `group_size` does not divide B.

  References:
    Tajwar et al., 2026, "Maximum Likelihood Reinforcement Learning", arXiv 2602.02710.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.maxrl_advantages(jnp.array([1.0, 0.0, 0.0, 0.0]), group_size=4)
    Array([ 3., -1., -1., -1.], dtype=float32)
  """
  grouped = _grouped(rewards, group_size)
  centred, scale = _centred(grouped)  # r - mean = centred * scale, 0 for equal rewards
  mean = jnp.mean(grouped, axis=1, keepdims=True)
  return jnp.where(mean > 0, safe_divide(centred * scale, mean), 0.0).reshape(-1)
