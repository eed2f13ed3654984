"""Sequence-level ratio losses: GSPO's clipped sequence ratio (and its token form, with
per-token advantages) and GMPO's clipped geometric mean of the token ratios.

Shapes and masking as `policy`'s: logp, old_logp, advantages, mask [B, T]; seq_advantages
[B]; masked positions sanitised before any arithmetic; ratios through `importance_ratio`.
"""

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, masked_mean, safe_divide, sanitise
from jaxcredit.logprobs import importance_ratio
from jaxcredit.losses._ratio import (
    Metrics,
    TokenRatios,
    check_clip,
    clipped_surrogate,
    fraction,
    ratio_metrics,
    token_inputs,
    token_ratio_loss,
)


def gspo_loss(
    logp: Array,
    old_logp: Array,
    seq_advantages: Array,
    mask: Array,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[Array, Metrics]:
  """Group Sequence Policy Optimisation, sequence-level::

    s_i = exp(mean over valid t of (logp - old_logp))      (length-normalised ratio)
    L   = mean_i max(-A_i * s_i, -A_i * clip(s_i, 1 - clip_low, 1 + clip_high))

  over all B rows; a row with no valid token contributes 0.

  Args:
    logp: ``[B, T]`` log-probs under the policy being updated.
    old_logp: ``[B, T]`` log-probs under the policy the ratio is taken against.
    seq_advantages: ``[B]`` one advantage per response.
    mask: ``[B, T]`` policy actions.
    clip_low: the ratio's lower clip, 1 - clip_low.
    clip_high: the ratio's upper clip, 1 + clip_high.

  Returns:
    ``(loss, metrics)``: a float32 scalar, and clipfrac (the fraction of non-empty rows
    clipped), seq_ratio_mean, approx_kl and token ratio statistics.

  Raises:
    ValueError: on mismatched shapes, invalid clips or an unknown aggregation.

  References:
    Zheng et al., 2025, "Group Sequence Policy Optimization", arXiv 2507.18071.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> loss, metrics = losses.gspo_loss(logp, old, jnp.ones(1), mask)
    >>> round(float(loss), 4)
    -1.0004
    >>> round(float(metrics['clipfrac']), 4), round(float(metrics['seq_ratio_mean']), 4)
    (1.0, 1.3416)
  """
  _checks.check_token_and_seq(
      {"logp": logp, "old_logp": old_logp, "mask": mask},
      {"seq_advantages": seq_advantages},
  )
  check_clip(clip_low, clip_high)
  valid = as_bool(mask)
  log_ratio = sanitise(logp, valid) - sanitise(old_logp, valid)
  nonempty = jnp.any(valid, axis=1)
  seq_ratio = importance_ratio(masked_mean(log_ratio, valid, axis=1))
  loss_seq, is_clipped = clipped_surrogate(
      seq_ratio, seq_advantages.astype(jnp.float32), clip_low, clip_high
  )
  loss_seq = jnp.where(nonempty, loss_seq, 0.0)
  n_rows = jnp.sum(nonempty, dtype=jnp.float32)
  metrics = {
      "clipfrac": safe_divide(jnp.sum(is_clipped & nonempty), n_rows),
      "seq_ratio_mean": safe_divide(jnp.sum(jnp.where(nonempty, seq_ratio, 0.0)), n_rows),
      **ratio_metrics(log_ratio, valid),
  }
  return jnp.mean(loss_seq), metrics


def gspo_token_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    aggregation: str = "seq-mean-token-mean",
) -> tuple[Array, Metrics]:
  """GSPO-token: the sequence ratio with per-token advantages::

    s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)],    s_i = exp(mean_valid(logp - old_logp))
    l_t     = max(-A_t s_{i,t}, -A_t clip(s_{i,t}, 1 - clip_low, 1 + clip_high))

  numerically s_i at every token, with the gradient of log pi(y_t). With A_t = A_i it has
  GSPO's gradient.

  Args:
    logp: ``[B, T]`` log-probs under the policy being updated.
    old_logp: ``[B, T]`` log-probs under the policy the ratio is taken against.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    clip_low: the ratio's lower clip, 1 - clip_low.
    clip_high: the ratio's upper clip, 1 + clip_high.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and clipfrac, approx_kl and ratio statistics.

  Raises:
    ValueError: on mismatched shapes, invalid clips or an unknown aggregation.

  References:
    Zheng et al., 2025, "Group Sequence Policy Optimization", arXiv 2507.18071.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> loss, metrics = losses.gspo_token_loss(logp, old, adv, mask)
    >>> round(float(loss), 4)
    -1.0004
    >>> round(float(metrics['clipfrac']), 4)
    1.0
  """
  check_clip(clip_low, clip_high)

  def formula(t: TokenRatios):
    seq_log_ratio = jax.lax.stop_gradient(masked_mean(t.log_ratio, t.valid, axis=1))
    log_token_ratio = seq_log_ratio[:, None] + t.logp - jax.lax.stop_gradient(t.logp)
    loss_tok, is_clipped = clipped_surrogate(importance_ratio(log_token_ratio), t.advantages,
                                             clip_low, clip_high)
    return loss_tok, {"clipfrac": fraction(is_clipped, t.valid)}

  return token_ratio_loss(formula, logp, old_logp, advantages, mask, aggregation)


def gmpo_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    *,
    clip_low: float = 0.4,
    clip_high: float = 0.4,
) -> tuple[Array, Metrics]:
  """Geometric-Mean Policy Optimisation, sequence-level.

  Token log-ratios are clipped in log space on the side that matters for the sign of
  ``A_i = mean_valid(A_t)``::

    lr_t = min(lr_t, clip_high) if A_i > 0,   max(lr_t, -clip_low) if A_i < 0
    L    = mean_i -A_i * exp(mean_valid(lr_t))

  over all B rows (a row with no valid token contributes 0).

  Args:
    logp: ``[B, T]`` log-probs under the policy being updated.
    old_logp: ``[B, T]`` log-probs under the policy the ratio is taken against.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    clip_low: the log-ratio's lower clip, -clip_low.
    clip_high: the log-ratio's upper clip.

  Returns:
    ``(loss, metrics)``: a float32 scalar, and clipfrac, approx_kl and ratio statistics.

  Raises:
    ValueError: on mismatched shapes.

  References:
    Zhao et al., 2025, "Geometric-Mean Policy Optimization", arXiv 2507.20673.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> loss, metrics = losses.gmpo_loss(logp, old, adv, mask)
    >>> round(float(loss), 4)
    -1.2214
    >>> round(float(metrics['clipfrac']), 4)
    0.5
  """
  valid, log_ratio, advantages = token_inputs(logp, old_logp, advantages, mask)
  seq_advantages = masked_mean(advantages, valid, axis=1)
  sign = jnp.sign(seq_advantages)[:, None]
  bounded = jnp.clip(log_ratio, -clip_low, clip_high)
  clipped_log_ratio = sign * jnp.minimum(sign * log_ratio, sign * bounded)
  seq_ratio = importance_ratio(masked_mean(clipped_log_ratio, valid, axis=1))
  nonempty = jnp.any(valid, axis=1)
  loss = jnp.mean(jnp.where(nonempty, -seq_advantages * seq_ratio, 0.0))
  is_clipped = ((sign > 0) & (log_ratio > clip_high)) | ((sign < 0) & (log_ratio < -clip_low))
  metrics = {
      "clipfrac": fraction(is_clipped, valid),
      **ratio_metrics(log_ratio, valid),
  }
  return loss, metrics
