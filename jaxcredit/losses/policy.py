"""Clipped policy-gradient losses on per-token log-probs (the sequence-level ratios of GSPO
and GMPO: `sequence_ratio`).

Shapes: logp, old_logp, advantages, mask [B, T]. Masked
positions are sanitised before any arithmetic, so NaN/-inf there reach
neither the loss nor its gradient. Ratios go through `importance_ratio`
(log-ratio clipped to +-20 before exp), so any finite log-ratio gives a finite
loss and gradient.
"""

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, masked_mean, sanitise
from jaxcredit.losses._ratio import (
    Metrics,
    TokenRatios,
    check_clip,
    clipped_surrogate,
    fraction,
    token_ratio_loss,
)
from jaxcredit.losses.aggregation import aggregate

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
  """PPO's clipped surrogate (Schulman et al., 2017), per token::

    ratio = exp(logp - old_logp)
    l_t   = max(-A_t * ratio, -A_t * clip(ratio, 1 - clip_low, 1 + clip_high))

  clip_high > clip_low is DAPO's clip-higher (Yu et al., 2025). With dual_clip = c > 1
  (Ye et al., 2020), where A_t < 0: ``l_t = min(l_t, -A_t * c)``.

  Args:
    logp: ``[B, T]`` log-probs under the policy being updated.
    old_logp: ``[B, T]`` log-probs under the policy that the ratio is taken against.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    clip_low: the ratio's lower clip, 1 - clip_low.
    clip_high: the ratio's upper clip, 1 + clip_high.
    dual_clip: c > 1, or None for no dual clip.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and clipfrac, clipfrac_low, clipfrac_high,
    dual_clipfrac, approx_kl and ratio_mean/max/min (token means over valid tokens).

  Raises:
    ValueError: on invalid clips, dual_clip <= 1 or an unknown aggregation.

  References:
    Schulman et al., 2017, "Proximal Policy Optimization Algorithms", arXiv 1707.06347;
    Yu et al., 2025, "DAPO", arXiv 2503.14476; Ye et al., 2020, "Mastering Complex Control
    in MOBA Games with Deep Reinforcement Learning", arXiv 1912.09729.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old_logp = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> loss, metrics = losses.ppo_clip_loss(logp, old_logp, jnp.ones((1, 2)),
    ...                                      jnp.ones((1, 2), bool))
    >>> round(float(loss), 4), float(metrics["clipfrac"])  # ratio 1.8 is clipped to 1.2
    (-1.1, 0.5)
  """
  check_clip(clip_low, clip_high)
  if dual_clip is not None:
    _checks.check_in_range(dual_clip, "dual_clip", low=1.0, low_open=True)

  def formula(t: TokenRatios):
    loss_tok, is_clipped = clipped_surrogate(t.ratio, t.advantages, clip_low, clip_high)
    metrics = {
        "clipfrac": fraction(is_clipped, t.valid),
        "clipfrac_low": fraction((t.ratio < 1.0 - clip_low) & (t.advantages < 0), t.valid),
        "clipfrac_high": fraction((t.ratio > 1.0 + clip_high) & (t.advantages > 0), t.valid),
    }
    if dual_clip is not None:
      lower_bound = -t.advantages * dual_clip
      dual_active = (t.advantages < 0) & (loss_tok > lower_bound)
      loss_tok = jnp.where(t.advantages < 0, jnp.minimum(loss_tok, lower_bound), loss_tok)
      metrics["dual_clipfrac"] = fraction(dual_active, t.valid)
    return loss_tok, metrics

  return token_ratio_loss(formula, logp, old_logp, advantages, mask, aggregation)


def pg_loss(
    logp: Array, advantages: Array, mask: Array, *, aggregation: str = "token-mean"
) -> tuple[Array, Metrics]:
  """REINFORCE: ``l_t = -A_t log pi(a_t)``, aggregated.

  The on-policy gradient with no ratio or clipping (also GPG's loss).

  Args:
    logp: ``[B, T]`` log-probs under the policy being updated.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and advantage_mean and logp_mean over valid
    tokens.

  Raises:
    ValueError: on mismatched shapes or an unknown aggregation.

  References:
    Williams, 1992, "Simple Statistical Gradient-Following Algorithms for Connectionist
    Reinforcement Learning", Machine Learning 8.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> loss, _ = losses.pg_loss(jnp.log(jnp.array([[0.5, 0.25]])), jnp.array([[1.0, -1.0]]),
    ...                          jnp.ones((1, 2), bool))
    >>> round(float(loss), 4)  # (-log 0.5 + log 0.25) / 2
    -0.3466
  """
  _checks.check_token_and_seq({"logp": logp, "advantages": advantages, "mask": mask}, {})
  valid = as_bool(mask)
  logp, advantages = sanitise(logp, valid), sanitise(advantages, valid)
  metrics = {
      "advantage_mean": masked_mean(advantages, valid),
      "logp_mean": masked_mean(logp, valid)
  }
  return aggregate(-advantages * logp, valid, aggregation), metrics


def cispo_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    aggregation: str = "token-mean",
) -> tuple[Array, Metrics]:
  """CISPO: clip the importance weight, not the update::

    l_t = -sg[clip(r_t, 1 - clip_low, 1 + clip_high)] * A_t * log pi(a_t)

  so every token keeps a gradient (rare "fork" tokens are not clipped away). clip_low=1.0
  means no lower bound, as in the paper.

  Args:
    logp: ``[B, T]`` log-probs under the policy being updated.
    old_logp: ``[B, T]`` log-probs under the policy the ratio is taken against.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    clip_low: the ratio's lower clip, 1 - clip_low.
    clip_high: the ratio's upper clip, 1 + clip_high.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and clipfrac (weights that were clipped),
    approx_kl and ratio statistics.

  Raises:
    ValueError: on mismatched shapes, invalid clips or an unknown aggregation.

  References:
    MiniMax, 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention", arXiv 2506.13585.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> loss, metrics = losses.cispo_loss(logp, old, adv, mask)
    >>> round(float(loss), 4)
    0.414
    >>> round(float(metrics['clipfrac']), 4)
    0.5
  """
  check_clip(clip_low, clip_high)

  def formula(t: TokenRatios):
    weight = jax.lax.stop_gradient(jnp.clip(t.ratio, 1.0 - clip_low, 1.0 + clip_high))
    clipped = (t.ratio < 1.0 - clip_low) | (t.ratio > 1.0 + clip_high)
    return -weight * t.advantages * t.logp, {"clipfrac": fraction(clipped, t.valid)}

  return token_ratio_loss(formula, logp, old_logp, advantages, mask, aggregation)


def sapo_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    aggregation: str = "token-mean",
) -> tuple[Array, Metrics]:
  """Soft Adaptive Policy Optimisation: a soft trust region::

    f(r) = (4 / tau) * sigmoid(tau * (r - 1)),   tau = tau_pos if A_t > 0 else tau_neg
    l_t  = -f(r_t) * A_t

  The gate's slope is 1 at r = 1 (the on-policy gradient) and decays smoothly off-policy
  instead of a hard clip.

  Args:
    logp: ``[B, T]`` log-probs under the policy being updated.
    old_logp: ``[B, T]`` log-probs under the policy the ratio is taken against.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    tau_pos: the gate's temperature for positive advantages, > 0.
    tau_neg: the gate's temperature for non-positive advantages, > 0.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and gate_mean (``f'(r) = 4 sigmoid (1 -
    sigmoid)``, the gradient scale), approx_kl and ratio statistics.

  Raises:
    ValueError: on mismatched shapes, a temperature <= 0 or an unknown aggregation.

  References:
    Gao et al., 2025, "Soft Adaptive Policy Optimization", arXiv 2511.20347.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> loss, metrics = losses.sapo_loss(logp, old, adv, mask)
    >>> round(float(loss), 4)
    -2.3799
    >>> round(float(metrics['gate_mean']), 4)
    0.9278
  """
  _checks.check_in_range(tau_pos, "tau_pos", low=0.0, low_open=True)
  _checks.check_in_range(tau_neg, "tau_neg", low=0.0, low_open=True)

  def formula(t: TokenRatios):
    tau = jnp.where(t.advantages > 0, tau_pos, tau_neg)
    gate = jax.nn.sigmoid(tau * (t.ratio - 1.0))
    return -(4.0 / tau) * gate * t.advantages, {
        "gate_mean": masked_mean(4.0 * gate * (1.0 - gate), t.valid)
    }

  return token_ratio_loss(formula, logp, old_logp, advantages, mask, aggregation)
