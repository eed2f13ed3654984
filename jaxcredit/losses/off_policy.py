"""Off-policy policy losses: three log-probs per token, corrections for stale or
mismatched samplers.

  behaviour_logp  log mu(y_t)       what the sampler computed while sampling
  old_logp        log pi_old(y_t)   the learner's recomputation before its updates
                                    (the proximal policy of decoupled PPO)
  logp            log pi_theta(y_t) the policy being trained (gradients flow here)

`r_t = pi_theta / pi_old` is the trust-region ratio and `w_t = pi_old / mu` the
behaviour importance weight. Shapes: [B, T] token arrays, [B] staleness. Masked
positions are sanitised before any arithmetic and every log-ratio is bounded by
+-LOG_RATIO_BOUND before exp, so any finite log-ratio gives a finite loss and
gradient. With mu = pi_old = pi_theta every ratio-form loss here equals
`ppo_clip_loss` and every loss has its gradient (tested).
"""

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, masked_mean, masked_sum, safe_divide, sanitise
from jaxcredit.logprobs import LOG_RATIO_BOUND
from jaxcredit.losses._ratio import (
    Metrics,
    TokenRatios,
    fraction,
    row_level,
    token_ratio_loss,
    weighted_ppo,
)

IS_LEVELS = ("token", "sequence", "geometric")


def behaviour_log_weight(old_logp: Array, behaviour_logp: Array, mask: Array,
                         level: str = "token") -> Array:
  """The behaviour importance log-weight log w at `level`::

    token      log w_t = log pi_old(y_t) - log mu(y_t)
    sequence   sum over the row's valid tokens of log w_t (the sequence's ratio)
    geometric  mean over the row's valid tokens of log w_t (length-normalised)

  Args:
    old_logp: ``[B, T]`` log pi_old, the learner's recomputation before its updates.
    behaviour_logp: ``[B, T]`` log mu, what the sampler computed.
    mask: ``[B, T]`` policy actions.
    level: one of `IS_LEVELS`.

  Returns:
    float32 ``[B, T]``, bounded by +-LOG_RATIO_BOUND, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes or an unknown level.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> mu = jnp.log(jnp.array([[0.5, 0.25]]))
    >>> losses.behaviour_log_weight(old, mu, jnp.ones((1, 2), bool), level="sequence").round(4)
    Array([[0.6931, 0.6931]], dtype=float32)
  """
  _checks.check_choice(level, IS_LEVELS, "importance-weight level")
  _checks.check_same_shape(old_logp=old_logp, behaviour_logp=behaviour_logp, mask=mask)
  valid = as_bool(mask)
  log_w = sanitise(old_logp, valid) - sanitise(behaviour_logp, valid)
  if level == "sequence":
    log_w = jnp.broadcast_to(masked_sum(log_w, valid, axis=1)[:, None], log_w.shape)
  elif level == "geometric":
    log_w = jnp.broadcast_to(masked_mean(log_w, valid, axis=1)[:, None], log_w.shape)
  return jnp.where(valid, jnp.clip(log_w, -LOG_RATIO_BOUND, LOG_RATIO_BOUND), 0.0)


def tis_loss(logp: Array, old_logp: Array, behaviour_logp: Array, advantages: Array, mask: Array,
             *, cap: float = 2.0, level: str = "token", clip_low: float = 0.2,
             clip_high: float = 0.2, aggregation: str = "token-mean") -> tuple[Array, Metrics]:
  """Truncated importance sampling::

    l_t = sg(min(w, cap)) * max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))

  with w the behaviour weight at `level` ("token": w_t; "sequence": the product of the row's
  w_t). Checked against verl's rollout correction (verl/trainer/ppo/rollout_corr_helper.py,
  `rollout_is` token and sequence truncation).

  Args:
    logp: ``[B, T]`` log pi_theta, the policy being trained.
    old_logp: ``[B, T]`` log pi_old, the learner's recomputation before its updates.
    behaviour_logp: ``[B, T]`` log mu, what the sampler computed.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    cap: the weight's truncation, > 0.
    level: "token" or "sequence" (the product of the row's weights).
    clip_low: the ratio's lower clip, 1 - clip_low.
    clip_high: the ratio's upper clip, 1 + clip_high.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and is_weight_mean (after truncation),
    is_truncated_fraction, clipfrac, approx_kl and ratio statistics of r.

  Raises:
    ValueError: on mismatched shapes, invalid settings or an unknown aggregation.

  References:
    Yao et al., 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training" (blog post).

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> mu = jnp.log(jnp.array([[0.5, 0.25]]))
    >>> loss, metrics = losses.tis_loss(logp, old, mu, adv, mask, cap=1.5)
    >>> round(float(loss), 4)
    -1.4
    >>> round(float(metrics['is_truncated_fraction']), 4)
    0.5
  """
  _checks.check_in_range(cap, "cap", low=0.0, low_open=True)
  log_w = behaviour_log_weight(old_logp, behaviour_logp, mask, level)

  def weight(t):
    return jnp.minimum(jnp.exp(log_w), cap), {
        "is_truncated_fraction": fraction(log_w > jnp.log(cap), t.valid)}

  return weighted_ppo(weight, logp, old_logp, advantages, mask, clip_low, clip_high, aggregation)


def masked_is_loss(logp: Array, old_logp: Array, behaviour_logp: Array, advantages: Array,
                   mask: Array, *, low: float = 0.5, high: float = 2.0, level: str = "token",
                   clip_low: float = 0.2, clip_high: float = 0.2,
                   aggregation: str = "token-mean") -> tuple[Array, Metrics]:
  """Masked importance sampling (IcePop; MIS): weights outside a band are dropped instead of
  truncated::

    l_t = sg(w 1[low <= w <= high]) * max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))

  with w the behaviour weight at `level` ("token": w_t; "sequence": the row's geometric mean
  exp(mean_t log w_t), which drops or keeps whole responses). A dropped token stays in the
  loss's denominator (it contributes 0).

  Relation to verl's rejection masks (verl 0.9, trainer/ppo/rollout_corr_helper.py,
  `compute_rollout_rejection_mask`), which agree after two convention mappings (tested
  against that function's own code)::

    bounds: verl bounds k1 = -log w, i.e. 1/w: its `token_k1` (level "token") and
      `seq_mean_k1` (level "sequence") with threshold "a_b" keep the tokens kept here
      with low = 1/b, high = 1/a.
    aggregation: verl removes rejected tokens from the response mask, so its
      token-mean divides by the kept tokens; here by every valid token: verl's loss is
      this loss times (valid tokens / kept tokens).

  Args:
    logp: ``[B, T]`` log pi_theta, the policy being trained.
    old_logp: ``[B, T]`` log pi_old, the learner's recomputation before its updates.
    behaviour_logp: ``[B, T]`` log mu, what the sampler computed.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    low: the band's lower end, >= 0.
    high: the band's upper end, >= low.
    level: "token" or "sequence" (the row's geometric mean weight).
    clip_low: the ratio's lower clip, 1 - clip_low.
    clip_high: the ratio's upper clip, 1 + clip_high.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and is_masked_fraction, is_weight_mean (after
    masking), clipfrac, approx_kl and ratio statistics.

  Raises:
    ValueError: on mismatched shapes, invalid settings or an unknown aggregation.

  References:
    Ling Team, 2025, "Every Step Evolves" (IcePop), arXiv 2510.18855.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> mu = jnp.log(jnp.array([[0.5, 0.25]]))
    >>> loss, metrics = losses.masked_is_loss(logp, old, mu, adv, mask, high=1.5)
    >>> round(float(loss), 4)
    -0.5
    >>> round(float(metrics['is_masked_fraction']), 4)
    0.5
  """
  _checks.check_in_range(low, "low", low=0.0)
  _checks.check_in_range(high, "high", low=0.0, low_open=True)
  if low > high:
    raise ValueError(f"masked_is needs low <= high, got low={low!r} > high={high!r}.")
  log_w = behaviour_log_weight(old_logp, behaviour_logp, mask, row_level(level, "masked_is"))

  def weight(t):
    w = jnp.exp(log_w)
    inside = (w >= low) & (w <= high)
    return jnp.where(inside, w, 0.0), {"is_masked_fraction": fraction(~inside, t.valid)}

  return weighted_ppo(weight, logp, old_logp, advantages, mask, clip_low, clip_high, aggregation)


def opsm_loss(logp: Array, old_logp: Array, behaviour_logp: Array, advantages: Array,
              mask: Array, *, delta: float = 1e-4, clip_low: float = 0.2, clip_high: float = 0.2,
              aggregation: str = "token-mean") -> tuple[Array, Metrics]:
  """Off-policy sequence masking (DeepSeek-V3.2; slime's OPSM): ppo_clip with the tokens of a
  response dropped where A_t < 0 and the response has drifted::

    KL_i   = mean over valid t of (log mu(y_t) - sg[log pi_theta(y_t)])
    keep_t = not (A_t < 0 and KL_i > delta)

  Checked against slime (slime/utils/ppo_utils.py, `compute_opsm_mask`).

  Args:
    logp: ``[B, T]`` log pi_theta, the policy being trained.
    old_logp: ``[B, T]`` log pi_old, the learner's recomputation before its updates.
    behaviour_logp: ``[B, T]`` log mu, what the sampler computed.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    delta: the drift threshold, >= 0.
    clip_low: the ratio's lower clip, 1 - clip_low.
    clip_high: the ratio's upper clip, 1 + clip_high.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and opsm_masked_fraction (of valid tokens),
    seq_kl_mean, clipfrac, approx_kl and ratio statistics.

  Raises:
    ValueError: on mismatched shapes, invalid settings or an unknown aggregation.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> mu = jnp.log(jnp.array([[0.9, 0.9]]))  # the sampler drifted
    >>> adv = -adv
    >>> loss, metrics = losses.opsm_loss(logp, old, mu, adv, mask)
    >>> round(float(loss), 4)
    0.0
    >>> round(float(metrics['opsm_masked_fraction']), 4)
    1.0
  """
  _checks.check_in_range(delta, "delta", low=0.0)
  _checks.check_same_shape(logp=logp, behaviour_logp=behaviour_logp)
  valid = as_bool(mask)
  seq_kl = masked_mean(sanitise(behaviour_logp, valid)
                       - jax.lax.stop_gradient(sanitise(logp, valid)), valid, axis=1)

  def weight(t):
    dropped = (t.advantages < 0) & (seq_kl[:, None] > delta)
    return jnp.where(dropped, 0.0, 1.0), {
        "opsm_masked_fraction": fraction(dropped, t.valid),
        "seq_kl_mean": jnp.mean(jnp.where(jnp.any(valid, axis=1), seq_kl, 0.0))}

  return weighted_ppo(weight, logp, old_logp, advantages, mask, clip_low, clip_high, aggregation)


def m2po_loss(logp: Array, old_logp: Array, behaviour_logp: Array, advantages: Array,
              mask: Array, *, threshold: float = 0.04,
              aggregation: str = "token-mean") -> tuple[Array, Metrics]:
  """Second-moment trust policy optimisation: no ratio clipping; instead the tokens with the
  largest ``M2_t = (log w_t)^2`` are masked, largest first, until the mean M2 of the kept
  valid tokens is below `threshold` (`m2_keep_mask`)::

    l_t = -A_t r_t keep_t

  Checked against AReaL (areal/trainer/ppo/actor.py, `_apply_m2po_masking`).

  Args:
    logp: ``[B, T]`` log pi_theta, the policy being trained.
    old_logp: ``[B, T]`` log pi_old, the learner's recomputation before its updates.
    behaviour_logp: ``[B, T]`` log mu, what the sampler computed.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    threshold: the kept tokens' mean M2 bound, > 0.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and m2 (before masking), m2_kept, m2_masked_fraction,
    approx_kl and ratio statistics.

  Raises:
    ValueError: on mismatched shapes, invalid settings or an unknown aggregation.

  References:
    Zheng et al., 2025, arXiv 2510.01161.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> mu = jnp.log(jnp.array([[0.5, 0.25]]))
    >>> loss, metrics = losses.m2po_loss(logp, old, mu, adv, mask)
    >>> round(float(loss), 4)
    -0.5
    >>> round(float(metrics['m2_masked_fraction']), 4)
    0.5
  """
  _checks.check_in_range(threshold, "threshold", low=0.0, low_open=True)
  log_w = behaviour_log_weight(old_logp, behaviour_logp, mask)
  valid = as_bool(mask)
  keep = m2_keep_mask(log_w, valid, threshold)

  def formula(t: TokenRatios):
    m2 = jnp.square(log_w)
    return -t.advantages * t.ratio * keep, {
        "m2": masked_mean(m2, t.valid), "m2_kept": masked_mean(m2, keep),
        "m2_masked_fraction": fraction(~keep, t.valid)}

  return token_ratio_loss(formula, logp, old_logp, advantages, mask, aggregation)


def m2_keep_mask(log_w: Array, valid: Array, threshold: float) -> Array:
  """The valid tokens M2PO keeps.

  With the n valid ``M2 = log_w^2`` sorted descending (ties in row-major order), the k
  largest are dropped for the smallest k whose remaining mean is below `threshold`
  (k = n - 1 when none is).

  Args:
    log_w: ``[B, T]`` behaviour log-weights.
    valid: ``[B, T]`` bool.
    threshold: the kept tokens' mean M2 bound.

  Returns:
    bool ``[B, T]``, a subset of `valid`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.losses import off_policy
    >>> off_policy.m2_keep_mask(jnp.array([[0.1, 2.0, 0.1]]), jnp.ones((1, 3), bool), 0.04)
    Array([[ True, False,  True]], dtype=bool)
  """
  valid = as_bool(valid)
  m2 = jnp.where(valid, jnp.square(log_w.astype(jnp.float32)), -1.0).reshape(-1)
  order = jnp.argsort(-m2, stable=True)
  sorted_m2 = jnp.maximum(m2[order], 0.0)
  n = jnp.sum(valid)
  index = jnp.arange(m2.size)
  remaining = jnp.sum(sorted_m2) - (jnp.cumsum(sorted_m2) - sorted_m2)
  below = (safe_divide(remaining, (n - index).astype(jnp.float32)) < threshold) & (index < n)
  dropped = jnp.where(jnp.any(below), jnp.argmax(below), jnp.maximum(n - 1, 0))
  rank = jnp.zeros_like(order).at[order].set(index)
  return (rank.reshape(valid.shape) >= dropped) & valid


def topr_loss(logp: Array, behaviour_logp: Array, advantages: Array, mask: Array, *,
              level: str = "sequence", threshold: float = 0.0,
              aggregation: str = "token-mean") -> tuple[Array, Metrics]:
  """Tapered off-policy REINFORCE: positive samples are learned from as in SFT, negative ones
  with a truncated weight::

    alpha_t = clip(pi_theta / mu, 0, 1) if A_t <= threshold else 1
    l_t     = -sg(alpha_t) A_t log pi_theta(y_t)

  the ratio taken per sequence (`level="sequence"`, the paper's pi(y|x) / mu(y|x)) or per
  token (`level="token"`, as Trinity-RFT's `topr` loss, which this was checked against:
  trinity/algorithm/policy_loss_fn/topr_policy_loss.py).

  Args:
    logp: ``[B, T]`` log pi_theta, the policy being trained.
    behaviour_logp: ``[B, T]`` log mu, what the sampler computed.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    level: "sequence" or "token".
    threshold: advantages at or below it are tapered.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and alpha_mean, approx_kl and ratio statistics of
    pi_theta / mu.

  Raises:
    ValueError: on mismatched shapes, invalid settings or an unknown aggregation.

  References:
    Le Roux et al., 2025, "Tapered Off-Policy REINFORCE", arXiv 2503.14286.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> mu = jnp.log(jnp.array([[0.5, 0.25]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> adv = jnp.array([[1.0, -1.0]])
    >>> loss, metrics = losses.topr_loss(logp, mu, adv, mask, level="token")
    >>> round(float(loss), 4)
    0.2939
    >>> round(float(metrics['alpha_mean']), 4)
    1.0
  """
  _checks.check_choice(level, ("token", "sequence"), "topr level")

  def formula(t: TokenRatios):
    log_r = behaviour_log_weight(jax.lax.stop_gradient(t.logp), t.logp - t.log_ratio, t.valid,
                                 level)
    alpha = jnp.where(t.advantages <= threshold, jnp.minimum(jnp.exp(log_r), 1.0), 1.0)
    return -jax.lax.stop_gradient(alpha) * t.advantages * t.logp, {
        "alpha_mean": masked_mean(alpha, t.valid)}

  return token_ratio_loss(formula, logp, behaviour_logp, advantages, mask, aggregation)
