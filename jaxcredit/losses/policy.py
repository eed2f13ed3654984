"""Clipped policy-gradient losses on per-token log-probs.

Shapes: logp, old_logp, advantages, mask [B, T]; seq_advantages [B]. Masked
positions are sanitised before any arithmetic, so NaN/-inf there reach
neither the loss nor its gradient.
"""

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, masked_mean, safe_divide, sanitise
from jaxcredit.losses.aggregation import aggregate

Metrics = dict[str, Array]


def _check_clip(clip_low: float, clip_high: float) -> None:
  if not 0 <= clip_low < 1 or clip_high < 0:
    raise ValueError(
        f"Need 0 <= clip_low < 1 and clip_high >= 0, got clip_low={clip_low}, "
        f"clip_high={clip_high}."
    )


def _ratio_metrics(log_ratio: Array, valid: Array) -> Metrics:
  """approx_kl = mean of k3(old || new) = (r - 1) - log r; ratio statistics.

  All are 0 when no token is valid.
  """
  ratio = jnp.exp(log_ratio)
  any_valid = jnp.any(valid)
  return {
      "approx_kl": masked_mean(ratio - 1.0 - log_ratio, valid),
      "ratio_mean": masked_mean(ratio, valid),
      "ratio_max": jnp.where(any_valid, jnp.max(jnp.where(valid, ratio, 0.0)), 0.0),
      "ratio_min": jnp.where(any_valid, jnp.min(jnp.where(valid, ratio, jnp.inf)), 0.0),
  }


def ppo_clip_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    aggregation: str = "token-mean",
) -> tuple[Array, Metrics]:
  """PPO clipped surrogate (Schulman et al., 2017), per token.

  ratio = exp(logp - old_logp)
  l_t   = max(-A_t * ratio, -A_t * clip(ratio, 1 - clip_low, 1 + clip_high))
  clip_high > clip_low is DAPO's clip-higher (Yu et al., 2025). With
  dual_clip = c > 1 (Ye et al., 2020), where A_t < 0: l_t = min(l_t, -A_t * c).
  The token losses are reduced with `aggregate(..., aggregation)`.
  Metrics: clipfrac, clipfrac_low, clipfrac_high, dual_clipfrac, approx_kl,
  ratio_mean/max/min (token means over valid tokens).
  """
  _checks.check_token_and_seq(
      {"logp": logp, "old_logp": old_logp, "advantages": advantages, "mask": mask}, {}
  )
  _check_clip(clip_low, clip_high)
  if dual_clip is not None and dual_clip <= 1.0:
    raise ValueError(f"dual_clip must be > 1, got {dual_clip}.")
  valid = as_bool(mask)
  log_ratio = sanitise(logp, valid) - sanitise(old_logp, valid)
  advantages = sanitise(advantages, valid)
  ratio = jnp.exp(log_ratio)
  unclipped = -advantages * ratio
  clipped = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  loss_tok = jnp.maximum(unclipped, clipped)
  metrics = {
      "clipfrac": masked_mean((clipped > unclipped).astype(jnp.float32), valid),
      "clipfrac_low": masked_mean(
          ((ratio < 1.0 - clip_low) & (advantages < 0)).astype(jnp.float32), valid
      ),
      "clipfrac_high": masked_mean(
          ((ratio > 1.0 + clip_high) & (advantages > 0)).astype(jnp.float32), valid
      ),
  }
  if dual_clip is not None:
    lower_bound = -advantages * dual_clip
    dual_active = (advantages < 0) & (loss_tok > lower_bound)
    loss_tok = jnp.where(advantages < 0, jnp.minimum(loss_tok, lower_bound), loss_tok)
    metrics["dual_clipfrac"] = masked_mean(dual_active.astype(jnp.float32), valid)
  metrics.update(_ratio_metrics(log_ratio, valid))
  return aggregate(loss_tok, valid, aggregation), metrics


def gspo_loss(
    logp: Array,
    old_logp: Array,
    seq_advantages: Array,
    mask: Array,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[Array, Metrics]:
  """Group Sequence Policy Optimisation (Zheng et al., 2025), sequence-level.

  s_i = exp(mean over valid t of (logp - old_logp))   (length-normalised ratio)
  L   = mean_i max(-A_i * s_i, -A_i * clip(s_i, 1 - clip_low, 1 + clip_high))
  over all B rows; a row with no valid token contributes 0. seq_advantages: [B].
  Metrics: clipfrac (fraction of non-empty rows clipped), seq_ratio_mean,
  approx_kl and token ratio statistics.
  """
  _checks.check_token_and_seq(
      {"logp": logp, "old_logp": old_logp, "mask": mask},
      {"seq_advantages": seq_advantages},
  )
  _check_clip(clip_low, clip_high)
  valid = as_bool(mask)
  log_ratio = sanitise(logp, valid) - sanitise(old_logp, valid)
  nonempty = jnp.any(valid, axis=1)
  seq_ratio = jnp.exp(masked_mean(log_ratio, valid, axis=1))
  advantages = seq_advantages.astype(jnp.float32)
  unclipped = -advantages * seq_ratio
  clipped = -advantages * jnp.clip(seq_ratio, 1.0 - clip_low, 1.0 + clip_high)
  loss_seq = jnp.where(nonempty, jnp.maximum(unclipped, clipped), 0.0)
  n_rows = jnp.sum(nonempty, dtype=jnp.float32)
  metrics = {
      "clipfrac": safe_divide(jnp.sum((clipped > unclipped) & nonempty), n_rows),
      "seq_ratio_mean": safe_divide(jnp.sum(jnp.where(nonempty, seq_ratio, 0.0)), n_rows),
      **_ratio_metrics(log_ratio, valid),
  }
  return jnp.mean(loss_seq), metrics
