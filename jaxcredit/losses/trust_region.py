"""PPO trust regions for stale and drifting samples: decoupled PPO anchored at a proximal
policy (recomputed, or log-linearly approximated without a forward pass), a clip range that
narrows with staleness, and divergence PPO's trust region on the sampled token's probabilities.

Log-probs as in `jaxcredit.losses.off_policy`: `logp` (pi_theta, trained), `old_logp` (pi_old,
the learner's recomputation, the proximal policy) and `behaviour_logp` (mu, the sampler's).
Shapes: [B, T] token arrays, [B] staleness.
"""

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, sanitise
from jaxcredit.losses._ratio import (
    Metrics,
    TokenRatios,
    check_clip,
    clipped_surrogate,
    fraction,
    row_level,
    token_ratio_loss,
    weighted_ppo,
)
from jaxcredit.losses.off_policy import behaviour_log_weight


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
                               row_level(level, "decoupled_ppo"))

  def weight(t):
    w = jnp.exp(log_w)
    over = jnp.zeros_like(t.valid) if cap is None else w > cap
    if cap is not None:
      w = jnp.where(over, 0.0, w) if cap_mode == "mask" else jnp.minimum(w, cap)
    return w, {"is_masked_fraction": fraction(over, t.valid)}

  return weighted_ppo(weight, logp, old_logp, advantages, mask, clip_low, clip_high, aggregation,
                       dual_clip)


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
