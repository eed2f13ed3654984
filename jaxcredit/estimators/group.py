"""Critic-free sequence baselines over groups of responses to one prompt.

rewards: [B] with `group_size` = G contiguous rows per prompt; B % G == 0.
"""

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, safe_divide, scale_down, safe_sqrt


def _grouped(rewards: Array, group_size: int) -> Array:
  """[B] -> float32 [B // G, G], validating rank and divisibility."""
  _checks.check_rank(rewards, 1, "rewards")
  _checks.check_group_size(rewards.shape[0], group_size)
  return rewards.astype(jnp.float32).reshape(-1, group_size)


def _centred(grouped: Array) -> tuple[Array, Array]:
  """(c, scale) with grouped - group mean = c * scale over axis 1, |c| <= 4.

  The rewards are halved (exact) and shifted by the group's first value, so a
  group of equal rewards gives c exactly 0 (no rounding residue for the std
  normalisation to blow up, even when XLA fuses the arithmetic), then divided
  by scale = max(1, max |shift|) (`scale_down`), so no finite rewards
  overflow here or in the squares of a std.
  """
  half = grouped * 0.5
  scaled, scale = scale_down(half - half[:, :1], axis=1)
  return 2.0 * (scaled - jnp.mean(scaled, axis=1, keepdims=True)), scale


def _std_normalised(centred: Array, scale: Array, ddof_count: int, eps: float) -> Array:
  """(x - mean) / (std_x + eps) from `_centred`'s (centred, scale), with
  std_x^2 = sum (x - mean)^2 / ddof_count over axis 1; 0 where std_x is 0,
  even with eps = 0."""
  _checks.check_in_range(eps, "eps", low=0.0)
  variance = jnp.sum(centred**2, axis=1, keepdims=True) / ddof_count
  return safe_divide(centred, safe_sqrt(variance) + eps / scale)


def grpo_advantages(
    rewards: Array,
    *,
    group_size: int,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> Array:
  """Group-normalised advantages (GRPO; Shao et al., 2024, DeepSeekMath)::

    A_i = (r_i - mean_g) / (std_g + eps)

  with the std over the G rewards of the group (ddof = 1). `scale_by_std=False` gives
  Dr. GRPO (Liu et al., 2025): ``r_i - mean_g``. Scale-invariant for any finite rewards (no
  float32 overflow in the centred squares).

  Args:
    rewards: ``[B]`` outcome rewards, groups of `group_size` contiguous rows.
    group_size: G, responses per prompt.
    eps: added to the std.
    scale_by_std: divide by the group's std (GRPO) or not (Dr. GRPO).

  Returns:
    float32 ``[B]``; 0 for a zero-variance group (even with eps = 0) and when G == 1.

  Raises:
    ValueError: when `group_size` does not divide B.

  References:
    Shao et al., 2024, "DeepSeekMath", arXiv 2402.03300; Liu et al., 2025,
    "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv 2503.20783.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.grpo_advantages(jnp.array([1.0, 0.0, 0.0, 0.0]), group_size=2).round(4)
    Array([ 0.7071, -0.7071,  0.    ,  0.    ], dtype=float32)
  """
  grouped = _grouped(rewards, group_size)
  if group_size == 1:
    return jnp.zeros(rewards.shape, jnp.float32)
  centred, scale = _centred(grouped)
  if scale_by_std:
    return _std_normalised(centred, scale, group_size - 1, eps).reshape(-1)
  return (centred * scale).reshape(-1)


def rloo_advantages(rewards: Array, *, group_size: int) -> Array:
  """Leave-one-out baseline (RLOO; Ahmadian et al., 2024)::

    A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean_g)

  Args:
    rewards: ``[B]`` outcome rewards, groups of `group_size` contiguous rows.
    group_size: G, responses per prompt.

  Returns:
    float32 ``[B]``; 0 when G == 1.

  Raises:
    ValueError: when `group_size` does not divide B.

  References:
    Ahmadian et al., 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs", arXiv 2402.14740.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.rloo_advantages(jnp.array([1.0, 0.0, 0.0]), group_size=3).round(4)
    Array([ 1. , -0.5, -0.5], dtype=float32)
  """
  grouped = _grouped(rewards, group_size)
  if group_size == 1:
    return jnp.zeros(rewards.shape, jnp.float32)
  centred, scale = _centred(grouped)
  return (centred * (group_size / (group_size - 1)) * scale).reshape(-1)


def broadcast_to_tokens(seq_values: Array, mask: Array) -> Array:
  """Gives every valid token of row b the value ``seq_values[b]``.

  Args:
    seq_values: ``[B]`` one value per response (a sequence-level advantage).
    mask: ``[B, T]`` policy actions.

  Returns:
    float32 ``[B, T]``, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.broadcast_to_tokens(jnp.array([2.0, -1.0]),
    ...                                jnp.array([[False, True, True], [False, True, False]]))
    Array([[ 0.,  2.,  2.],
           [ 0., -1.,  0.]], dtype=float32)
  """
  _checks.check_token_and_seq({"mask": mask}, {"seq_values": seq_values})
  return jnp.where(as_bool(mask), seq_values.astype(jnp.float32)[:, None], 0.0)


def outcome_to_tokens(rewards: Array, mask: Array) -> Array:
  """Places each sequence reward on the row's last valid token.

  Args:
    rewards: ``[B]`` one reward per response.
    mask: ``[B, T]`` policy actions.

  Returns:
    float32 ``[B, T]``, ``rewards[b]`` on row b's last valid token and 0 elsewhere; a row
    with no valid token gets all zeros.

  Raises:
    ValueError: on mismatched shapes.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import group
    >>> group.outcome_to_tokens(jnp.array([1.0]), jnp.array([[True, True, False]]))
    Array([[0., 1., 0.]], dtype=float32)
  """
  _checks.check_token_and_seq({"mask": mask}, {"rewards": rewards})
  valid = as_bool(mask)
  t = mask.shape[1]
  last = t - 1 - jnp.argmax(valid[:, ::-1], axis=1)
  is_last = (jnp.arange(t)[None, :] == last[:, None]) & valid
  return jnp.where(is_last, rewards.astype(jnp.float32)[:, None], 0.0)


def grpo_batch_std_advantages(rewards: Array, *, group_size: int, eps: float = 1e-6) -> Array:
  """Group mean, batch std (Lite PPO)::

    A_i = (r_i - mean_g) / (std_batch + eps)

  with the std (ddof = 1) over all B rewards. Steadier than the group std when many groups
  are nearly uniform.

  Args:
    rewards: ``[B]`` outcome rewards, groups of `group_size` contiguous rows.
    group_size: G, responses per prompt.
    eps: added to the batch std.

  Returns:
    float32 ``[B]``; 0 when B == 1 or all rewards are equal.

  Raises:
    ValueError: when `group_size` does not divide B or eps < 0.

  References:
    Liu et al., 2025, "Tricks or Traps? A Deep Dive into RL for LLM Reasoning",
    arXiv 2508.08221.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> rewards = jnp.array([1.0, 0.0, 0.0, 0.0])
    >>> estimators.grpo_batch_std_advantages(rewards, group_size=2).round(4)
    Array([ 1., -1.,  0.,  0.], dtype=float32)
  """
  grouped = _grouped(rewards, group_size)
  _checks.check_in_range(eps, "eps", low=0.0)
  batch = rewards.shape[0]
  if batch == 1:
    return jnp.zeros(rewards.shape, jnp.float32)
  # r - batch mean = centred * scale; re-centring each group's slice of it
  # (shifted by its first value: exact zeros for equal rewards) gives (r - group mean) / scale.
  centred, scale = _centred(grouped.reshape(1, -1))
  in_groups = centred.reshape(grouped.shape)
  shifted = in_groups - in_groups[:, :1]
  group_centred = shifted - jnp.mean(shifted, axis=1, keepdims=True)
  batch_std = safe_sqrt(jnp.sum(centred**2) / (batch - 1))
  return safe_divide(group_centred, batch_std + eps / scale).reshape(-1)


def remax_advantages(rewards: Array, baseline_rewards: Array) -> Array:
  """ReMax: the reward of the greedy response to the same prompt as baseline::

    A_i = r_i - b_i

  Args:
    rewards: ``[B]`` rewards of the sampled responses.
    baseline_rewards: ``[B]`` rewards of the greedy response to each row's prompt.

  Returns:
    float32 ``[B]``.

  Raises:
    ValueError: on mismatched shapes or a rank other than 1.

  References:
    Li et al., 2024, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
    Method for Aligning Large Language Models", arXiv 2310.10505.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.remax_advantages(jnp.array([1.0, 0.0]), jnp.array([0.0, 0.0]))
    Array([1., 0.], dtype=float32)
  """
  _checks.check_rank(rewards, 1, "rewards")
  _checks.check_same_shape(rewards=rewards, baseline_rewards=baseline_rewards)
  return rewards.astype(jnp.float32) - baseline_rewards.astype(jnp.float32)


def gpg_advantages(
    rewards: Array, *, group_size: int, scale_by_std: bool = False, eps: float = 1e-6
) -> Array:
  """Group Policy Gradient::

    A_i = alpha (r_i - mean_g) / F

  alpha = B / (B - M) rescales for the M rows in zero-variance groups, which carry no signal
  (alpha = B when every group is degenerate, and the advantages are 0 anyway);
  F = std_g + eps if `scale_by_std` else 1. verl computes alpha from the count of non-zero
  rewards instead; this follows the paper.

  Args:
    rewards: ``[B]`` outcome rewards, groups of `group_size` contiguous rows.
    group_size: G, responses per prompt.
    scale_by_std: divide by the group's std (ddof = 1).
    eps: added to the std.

  Returns:
    float32 ``[B]``.

  Raises:
    ValueError: when `group_size` does not divide B.

  References:
    Chu et al., 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv 2504.02546.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> rewards = jnp.array([1.0, 0.0, 0.0, 0.0])
    >>> estimators.gpg_advantages(rewards, group_size=2)  # alpha = 4 / (4 - 2)
    Array([ 1., -1.,  0.,  0.], dtype=float32)
  """
  grouped = _grouped(rewards, group_size)
  centred, scale = _centred(grouped)
  degenerate = jnp.all(centred == 0, axis=1, keepdims=True)
  n_degenerate = jnp.sum(degenerate) * group_size
  alpha = rewards.shape[0] / jnp.maximum(rewards.shape[0] - n_degenerate, 1)
  if scale_by_std and group_size > 1:
    return (alpha * _std_normalised(centred, scale, group_size - 1, eps)).reshape(-1)
  return (alpha * centred * scale).reshape(-1)


def gdpo_advantages(components: Array, *, group_size: int, weights: Array | None = None,
                    eps: float = 1e-6) -> Array:
  """Group reward-Decoupled normalisation (GDPO) of multi-component rewards::

    A_i = batch_norm( sum_k w_k (r_ik - mean_g r_k) / (std_g r_k + eps) )

  Each reward component is normalised within its group as GRPO normalises a reward (ddof =
  1), the weighted sum is then normalised over the batch (mean 0, ddof = 1 std 1), so
  distinct combinations of components keep distinct advantages where GRPO on their sum
  would merge them, and the scale does not grow with the number of components.

  Args:
    components: ``[B, K]`` the K reward components of each response, groups of
      `group_size` contiguous rows.
    group_size: G, responses per prompt.
    weights: ``[K]`` the components' weights; None for 1 each.
    eps: added to the group and batch stds.

  Returns:
    float32 ``[B]``; 0 when every response gets the same weighted sum (and when B == 1).

  Raises:
    ValueError: when `components` is not ``[B, K]``, `weights` not ``[K]``, or
      `group_size` does not divide B.

  References:
    Liu et al., 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization for
    Multi-reward RL Optimization", arXiv 2601.05242.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> components = jnp.array([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    >>> estimators.gdpo_advantages(components, group_size=4).round(4)
    Array([ 1.2247,  0.    ,  0.    , -1.2247], dtype=float32)
  """
  _checks.check_rank(components, 2, "components")
  batch, n_components = components.shape
  weights = jnp.ones(n_components) if weights is None else jnp.asarray(weights, jnp.float32)
  if weights.shape != (n_components,):
    raise ValueError(f"weights must be [K] = [{n_components}] for components "
                     f"{list(components.shape)}, got {list(weights.shape)}.")
  per_component = jnp.stack([grpo_advantages(components[:, k], group_size=group_size, eps=eps)
                             for k in range(n_components)], axis=1)
  total = per_component @ weights
  if batch == 1:
    return jnp.zeros(batch, jnp.float32)
  centred, scale = _centred(total.reshape(1, -1))
  return _std_normalised(centred, scale, batch - 1, eps).reshape(-1)
