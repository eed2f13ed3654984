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
    check_clip,
    clipped_surrogate,
    fraction,
    token_ratio_loss,
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


def _weighted_ppo(weight_fn, logp, old_logp, advantages, mask, clip_low, clip_high, aggregation,
                  dual_clip=None):
  """aggregate(sg(weight) * ppo_clip token loss); weight_fn(TokenRatios) -> (weight, metrics)."""
  check_clip(clip_low, clip_high)
  if dual_clip is not None:
    _checks.check_in_range(dual_clip, "dual_clip", low=1.0, low_open=True)

  def formula(t: TokenRatios):
    loss_tok, is_clipped = clipped_surrogate(t.ratio, t.advantages, clip_low, clip_high)
    if dual_clip is not None:
      loss_tok = jnp.where(t.advantages < 0, jnp.minimum(loss_tok, -t.advantages * dual_clip),
                           loss_tok)
    weight, metrics = weight_fn(t)
    return jax.lax.stop_gradient(weight) * loss_tok, {
        **metrics, "clipfrac": fraction(is_clipped, t.valid),
        "is_weight_mean": masked_mean(weight, t.valid)}

  return token_ratio_loss(formula, logp, old_logp, advantages, mask, aggregation)


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

  return _weighted_ppo(weight, logp, old_logp, advantages, mask, clip_low, clip_high, aggregation)


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
  log_w = behaviour_log_weight(old_logp, behaviour_logp, mask, _row_level(level, "masked_is"))

  def weight(t):
    w = jnp.exp(log_w)
    inside = (w >= low) & (w <= high)
    return jnp.where(inside, w, 0.0), {"is_masked_fraction": fraction(~inside, t.valid)}

  return _weighted_ppo(weight, logp, old_logp, advantages, mask, clip_low, clip_high, aggregation)


def loglinear_proximal_logprobs(logp: Array, behaviour_logp: Array, staleness: Array,
                                mask: Array) -> Array:
  """The proximal policy's log-probs approximated without a forward pass (AReaL's log-linear
  approximation, A-3PO)::

    log pi_prox = log mu + alpha (sg[log pi_theta] - log mu),    alpha = (s - 1) / s

  for a sample drawn s >= 1 updates ago (alpha = 0 for s <= 1), the proximal policy being
  one update behind the current one. Checked against AReaL (areal/trainer/ppo/actor.py,
  `compute_prox_logp_approximations`).

  Args:
    logp: ``[B, T]`` log pi_theta, the policy being trained.
    behaviour_logp: ``[B, T]`` log mu, what the sampler computed.
    staleness: ``[B]`` updates between each sample's sampling parameters and the learner's.
    mask: ``[B, T]`` policy actions.

  Returns:
    float32 ``[B, T]``.

  Raises:
    ValueError: on mismatched shapes.

  References:
    A-3PO, arXiv 2512.06547.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> mu = jnp.log(jnp.array([[0.5, 0.25]]))
    >>> staleness = jnp.array([2])  # alpha = 1 / 2
    >>> prox = losses.loglinear_proximal_logprobs(logp, mu, staleness, jnp.ones((1, 2), bool))
    >>> [round(p, 3) for p in jnp.exp(prox)[0].tolist()]  # the geometric mean of mu and pi
    [0.5, 0.474]
  """
  _checks.check_token_and_seq({"logp": logp, "behaviour_logp": behaviour_logp, "mask": mask},
                              {"staleness": staleness})
  valid = as_bool(mask)
  stale = jnp.asarray(staleness, jnp.float32)[:, None]
  alpha = jnp.where(stale > 1.0, (stale - 1.0) / jnp.maximum(stale, 1.0), 0.0)
  behaviour = sanitise(behaviour_logp, valid)
  return behaviour + alpha * (jax.lax.stop_gradient(sanitise(logp, valid)) - behaviour)


def decoupled_ppo_loss(logp: Array, old_logp: Array | None, behaviour_logp: Array,
                       advantages: Array, mask: Array, *, staleness: Array | None = None,
                       proximal: str = "recompute", cap: float | None = 5.0,
                       cap_mode: str = "mask", level: str = "token", clip_low: float = 0.2,
                       clip_high: float = 0.2, dual_clip: float | None = None,
                       aggregation: str = "token-mean") -> tuple[Array, Metrics]:
  """Decoupled PPO: the trust region is anchored at the proximal policy, the off-policy
  correction is the behaviour weight::

    l_t = sg(w~) * max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))
    w~  = w if w <= cap else 0   (cap_mode="mask"),   min(w, cap)   (cap_mode="truncate")

  Checked against AReaL (areal/utils/functional.py `ppo_actor_loss_fn`,
  `compute_behave_imp_weight`).

  Args:
    logp: ``[B, T]`` log pi_theta, the policy being trained.
    old_logp: ``[B, T]`` the proximal policy's log-probs; None with proximal="loglinear".
    behaviour_logp: ``[B, T]`` log mu, what the sampler computed.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    staleness: ``[B]`` updates since each sample was drawn (needed by proximal="loglinear").
    proximal: "recompute" (use old_logp) or "loglinear" (`loglinear_proximal_logprobs`).
    cap: the behaviour weight's cap, > 0, or None to leave w whole.
    cap_mode: "mask" or "truncate".
    level: "token" or "sequence" (the row's geometric mean weight).
    clip_low: the ratio's lower clip, 1 - clip_low.
    clip_high: the ratio's upper clip, 1 + clip_high.
    dual_clip: as in `ppo_clip_loss`.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and is_masked_fraction (weights over the cap),
    is_weight_mean, clipfrac, approx_kl and ratio statistics.

  Raises:
    ValueError: on an unknown proximal or cap_mode, a missing old_logp or staleness, or as
    `ppo_clip_loss`.

  References:
    Fu et al., 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
    Language Reasoning", arXiv 2505.24298.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> mu = jnp.log(jnp.array([[0.5, 0.25]]))
    >>> loss, metrics = losses.decoupled_ppo_loss(logp, old, mu, adv, mask, cap=1.5)
    >>> round(float(loss), 4)
    -0.5
    >>> round(float(metrics['is_masked_fraction']), 4), round(float(metrics['clipfrac']), 4)
    (0.5, 0.5)
  """
  _checks.check_choice(proximal, ("recompute", "loglinear"), "decoupled_ppo proximal")
  _checks.check_choice(cap_mode, ("mask", "truncate"), "decoupled_ppo cap_mode")
  if cap is not None:
    _checks.check_in_range(cap, "cap", low=0.0, low_open=True)
  if proximal == "loglinear":
    if staleness is None:
      raise ValueError("decoupled_ppo with proximal='loglinear' needs the staleness [B].")
    old_logp = loglinear_proximal_logprobs(logp, behaviour_logp, staleness, mask)
  elif old_logp is None:
    raise ValueError("decoupled_ppo with proximal='recompute' needs old_logp.")
  log_w = behaviour_log_weight(old_logp, behaviour_logp, mask,
                               _row_level(level, "decoupled_ppo"))

  def weight(t):
    w = jnp.exp(log_w)
    over = jnp.zeros_like(t.valid) if cap is None else w > cap
    if cap is not None:
      w = jnp.where(over, 0.0, w) if cap_mode == "mask" else jnp.minimum(w, cap)
    return w, {"is_masked_fraction": fraction(over, t.valid)}

  return _weighted_ppo(weight, logp, old_logp, advantages, mask, clip_low, clip_high, aggregation,
                       dual_clip)


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

  return _weighted_ppo(weight, logp, old_logp, advantages, mask, clip_low, clip_high, aggregation)


def dppo_loss(logp: Array, old_logp: Array, advantages: Array, mask: Array, *,
              divergence: str = "tv", clip_low: float = 0.2, clip_high: float = 0.2,
              ratio_cap: float = 20.0, aggregation: str = "token-mean") -> tuple[Array, Metrics]:
  """Divergence PPO, binary variants: tokens are masked by a divergence between the sampled
  token's probabilities ``p = pi_theta(y_t)`` and ``q = pi_old(y_t)`` instead of by the
  ratio::

    l_t = -A_t sg(min(r_t, ratio_cap)) sg(keep_t) log pi_theta(y_t)
    tv: keep_t = p - q <= clip_high  if A_t > 0,   p - q >= -clip_low  otherwise
    kl: D = q log(q / p) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8)),
        keep_t = D <= clip_high or p <= q  if A_t > 0,  D <= clip_low or p >= q  otherwise

  verl 0.9 ships the same losses (trainer/ppo/core_algos.py, `compute_policy_loss_dppo_tv` /
  `_kl`), where clip_ratio_low and clip_ratio_high are the divergence thresholds (clip_low,
  clip_high here) and clip_ratio_c (default 20.0) is ratio_cap. The cap trades truncation
  bias for variance: set it from the recipe being reproduced (Stable-RL's scripts choose
  their own).

  Args:
    logp: ``[B, T]`` log pi_theta, the policy being trained.
    old_logp: ``[B, T]`` log pi_old, the learner's recomputation before its updates.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    divergence: "tv" or "kl".
    clip_low: the divergence threshold for A_t <= 0, >= 0.
    clip_high: the divergence threshold for A_t > 0, >= 0.
    ratio_cap: the cap of the ratio weight, > 0.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and clipfrac (masked tokens), ratio_capped_fraction,
    approx_kl and ratio statistics.

  Raises:
    ValueError: on mismatched shapes, invalid settings or an unknown aggregation.

  References:
    "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv 2602.04879; its
    reference implementation is sail-sg/Stable-RL.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> loss, metrics = losses.dppo_loss(logp, old, adv, mask)
    >>> round(float(loss), 4)
    0.3466
    >>> round(float(metrics['clipfrac']), 4)
    0.5
  """
  _checks.check_choice(divergence, ("tv", "kl"), "dppo divergence")
  _checks.check_in_range(clip_low, "clip_low", low=0.0)
  _checks.check_in_range(clip_high, "clip_high", low=0.0)
  _checks.check_in_range(ratio_cap, "ratio_cap", low=0.0, low_open=True)

  def formula(t: TokenRatios):
    p = jnp.exp(jax.lax.stop_gradient(t.logp))
    q = jnp.exp(jax.lax.stop_gradient(t.logp - t.log_ratio))
    if divergence == "tv":
      keep = jnp.where(t.advantages > 0, p - q <= clip_high, p - q >= -clip_low)
    else:
      binary_kl = (q * -jax.lax.stop_gradient(t.log_ratio)
                   + (1.0 - q) * jnp.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8)))
      keep = jnp.where(t.advantages > 0, (binary_kl <= clip_high) | (p <= q),
                       (binary_kl <= clip_low) | (p >= q))
    weight = jax.lax.stop_gradient(jnp.where(keep, jnp.minimum(t.ratio, ratio_cap), 0.0))
    return -t.advantages * weight * t.logp, {
        "clipfrac": fraction(~keep, t.valid),
        "ratio_capped_fraction": fraction(keep & (t.ratio > ratio_cap), t.valid)}

  return token_ratio_loss(formula, logp, old_logp, advantages, mask, aggregation)


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


def sat_loss(logp: Array, old_logp: Array, advantages: Array, mask: Array, staleness: Array, *,
             clip_low: float = 0.2, clip_high: float = 0.2, decay: float = 0.5,
             aggregation: str = "token-mean") -> tuple[Array, Metrics]:
  """Staleness-adaptive trust region: ppo_clip whose clip range narrows with the sample's
  staleness s_i (updates between its sampling parameters and the learner's)::

    eps_low(s) = clip_low / (1 + decay s),   eps_high(s) = clip_high / (1 + decay s)
    l_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low(s_i), 1 + eps_high(s_i)))

  The idea of arXiv 2607.18722 (staleness-adaptive trust regions); its exact schedule could
  not be checked here, so this is the 1 / (1 + decay s) form, and decay = 0 (or s = 0) is
  ppo_clip.

  Args:
    logp: ``[B, T]`` log pi_theta, the policy being trained.
    old_logp: ``[B, T]`` log pi_old, the learner's recomputation before its updates.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    staleness: ``[B]`` updates between each sample's sampling parameters and the learner's.
    clip_low: the ratio's lower clip, 1 - clip_low.
    clip_high: the ratio's upper clip, 1 + clip_high.
    decay: how fast the range narrows, >= 0.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and clipfrac, clip_scale_mean (mean 1 / (1 + decay s)
    over rows), approx_kl and ratio statistics.

  Raises:
    ValueError: on mismatched shapes, invalid settings or an unknown aggregation.

  References:
    arXiv 2607.18722.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> loss, metrics = losses.sat_loss(logp, old, adv, mask, jnp.array([2]))
    >>> round(float(loss), 4)
    -1.05
    >>> round(float(metrics['clip_scale_mean']), 4)
    0.5
  """
  check_clip(clip_low, clip_high)
  _checks.check_in_range(decay, "decay", low=0.0)
  _checks.check_token_and_seq({"logp": logp, "mask": mask}, {"staleness": staleness})
  scale = 1.0 / (1.0 + decay * jnp.maximum(jnp.asarray(staleness, jnp.float32), 0.0))[:, None]

  def formula(t: TokenRatios):
    loss_tok, is_clipped = clipped_surrogate(t.ratio, t.advantages, clip_low * scale,
                                             clip_high * scale)
    return loss_tok, {"clipfrac": fraction(is_clipped, t.valid),
                      "clip_scale_mean": jnp.mean(scale)}

  return token_ratio_loss(formula, logp, old_logp, advantages, mask, aggregation)


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


def _row_level(level: str, loss: str) -> str:
  """A loss's "token" | "sequence" weight level as a `behaviour_log_weight` level
  ("sequence" is the length-normalised geometric mean)."""
  _checks.check_choice(level, ("token", "sequence"), f"{loss} level")
  return "geometric" if level == "sequence" else "token"
