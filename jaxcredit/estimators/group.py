"""Critic-free sequence baselines over groups of responses to one prompt.

rewards: [B] with `group_size` = G contiguous rows per prompt; B % G == 0.
"""

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, safe_divide


def _grouped(rewards: Array, group_size: int) -> Array:
  """[B] -> float32 [B // G, G], validating rank and divisibility."""
  _checks.check_rank(rewards, 1, "rewards")
  _checks.check_group_size(rewards.shape[0], group_size)
  return rewards.astype(jnp.float32).reshape(-1, group_size)


def _safe_sqrt(x: Array) -> Array:
  """sqrt with a finite gradient at 0 (the gradient there is taken as 0)."""
  positive = x > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def grpo_advantages(
    rewards: Array,
    *,
    group_size: int,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> Array:
  """Group-normalised advantages (GRPO; Shao et al., 2024, DeepSeekMath).

  A_i = (r_i - mean_g) / (std_g + eps), std with ddof=1 over the G rewards of
  the group. scale_by_std=False gives Dr. GRPO (Liu et al., 2025): r_i - mean_g.
  rewards: [B]. Returns float32 [B]; 0 for a zero-variance group (even with
  eps=0) and when G == 1.
  """
  grouped = _grouped(rewards, group_size)
  if group_size == 1:
    return jnp.zeros(rewards.shape, jnp.float32)
  centred = grouped - jnp.mean(grouped, axis=1, keepdims=True)
  if scale_by_std:
    variance = jnp.sum(centred**2, axis=1, keepdims=True) / (group_size - 1)
    centred = safe_divide(centred, _safe_sqrt(variance) + eps)  # eps=0 allowed
  return centred.reshape(-1)


def rloo_advantages(rewards: Array, *, group_size: int) -> Array:
  """Leave-one-out baseline (Ahmadian et al., 2024): A_i = r_i - mean_{j != i} r_j.

  Equals G / (G - 1) * (r_i - mean_g). rewards: [B]. Returns float32 [B]; 0 when
  group_size == 1.
  """
  grouped = _grouped(rewards, group_size)
  if group_size == 1:
    return jnp.zeros(rewards.shape, jnp.float32)
  centred = grouped - jnp.mean(grouped, axis=1, keepdims=True)
  return (centred * (group_size / (group_size - 1))).reshape(-1)


def broadcast_to_tokens(seq_values: Array, mask: Array) -> Array:
  """Gives every valid token of row b the value seq_values[b].

  seq_values: [B]; mask: [B, T]. Returns float32 [B, T], 0 at masked positions.
  """
  _checks.check_token_and_seq({"mask": mask}, {"seq_values": seq_values})
  return jnp.where(as_bool(mask), seq_values.astype(jnp.float32)[:, None], 0.0)


def outcome_to_tokens(rewards: Array, mask: Array) -> Array:
  """Places each sequence reward on the row's last valid token.

  rewards: [B]; mask: [B, T]. Returns float32 [B, T]; a row with no valid
  token gets all zeros.
  """
  _checks.check_token_and_seq({"mask": mask}, {"rewards": rewards})
  valid = as_bool(mask)
  t = mask.shape[1]
  last = t - 1 - jnp.argmax(valid[:, ::-1], axis=1)
  is_last = (jnp.arange(t)[None, :] == last[:, None]) & valid
  return jnp.where(is_last, rewards.astype(jnp.float32)[:, None], 0.0)
