"""What every ratio-based policy loss shares: input validation and
sanitising, the ratio, the clipped surrogate, clip-fraction and ratio metrics,
and aggregation. A token-level loss is its formula passed to
`token_ratio_loss`:

  def ppo_like(logp, old_logp, advantages, mask, *, aggregation="token-mean"):
    def formula(t: TokenRatios):                  # -> (loss_tok [B, T], metrics)
      return -t.advantages * t.ratio, {}
    return token_ratio_loss(formula, logp, old_logp, advantages, mask, aggregation)

Shapes: [B, T] token arrays; masked positions are sanitised before any
arithmetic, and log-ratios are bounded as in `logprobs.importance_ratio`.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, masked_mean, sanitise
from jaxcredit.logprobs import LOG_RATIO_BOUND, importance_ratio
from jaxcredit.losses.aggregation import aggregate

Metrics = dict[str, Array]


class TokenRatios(NamedTuple):
  """What a token-level ratio loss's formula reads: [B, T] arrays, 0 at masked positions.

  logp:       current log-probs (the gradient flows through them and `ratio`).
  log_ratio:  logp - old_logp.
  ratio:      importance_ratio(log_ratio) = exp(log_ratio), log-ratio bounded.
  advantages: A_t.
  valid:      bool, the tokens that count.
  """

  logp: Array
  log_ratio: Array
  ratio: Array
  advantages: Array
  valid: Array


TokenFormula = Callable[[TokenRatios], tuple[Array, Metrics]]


def token_ratio_loss(formula: TokenFormula, logp: Array, old_logp: Array, advantages: Array,
                     mask: Array, aggregation: str) -> tuple[Array, Metrics]:
  """aggregate(loss_tok, mask, aggregation) of formula(TokenRatios) -> (loss_tok, metrics),
  with the ratio statistics (`ratio_metrics`) appended to the formula's metrics."""
  valid, log_ratio, advantages = token_inputs(logp, old_logp, advantages, mask)
  ratios = TokenRatios(sanitise(logp, valid), log_ratio, importance_ratio(log_ratio), advantages,
                       valid)
  loss_tok, metrics = formula(ratios)
  return aggregate(loss_tok, valid, aggregation), {**metrics, **ratio_metrics(log_ratio, valid)}


def check_clip(clip_low: float, clip_high: float) -> None:
  _checks.check_in_range(clip_low, "clip_low", low=0.0, high=1.0)
  _checks.check_in_range(clip_high, "clip_high", low=0.0)


def ratio_metrics(log_ratio: Array, valid: Array) -> Metrics:
  """approx_kl = mean of k3(old || new) = (r - 1) - log r; ratio statistics.

  All are 0 when no token is valid; log r is bounded as in `importance_ratio`.
  """
  log_ratio = jnp.clip(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
  ratio = jnp.exp(log_ratio)
  any_valid = jnp.any(valid)
  return {
      "approx_kl": masked_mean(ratio - 1.0 - log_ratio, valid),
      "ratio_mean": masked_mean(ratio, valid),
      "ratio_max": jnp.where(any_valid, jnp.max(jnp.where(valid, ratio, 0.0)), 0.0),
      "ratio_min": jnp.where(any_valid, jnp.min(jnp.where(valid, ratio, jnp.inf)), 0.0),
  }


def token_inputs(logp, old_logp, advantages, mask):
  """Validates [B, T] inputs; returns (valid, sanitised log-ratio, advantages)."""
  _checks.check_token_and_seq(
      {"logp": logp, "old_logp": old_logp, "advantages": advantages, "mask": mask}, {}
  )
  valid = as_bool(mask)
  log_ratio = sanitise(logp, valid) - sanitise(old_logp, valid)
  return valid, log_ratio, sanitise(advantages, valid)


def clipped_surrogate(ratio: Array, advantages: Array, clip_low: float, clip_high: float):
  """Per-token max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) and where the clip is active."""
  unclipped = -advantages * ratio
  clipped = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  return jnp.maximum(unclipped, clipped), clipped > unclipped


def fraction(condition: Array, valid: Array) -> Array:
  return masked_mean(condition.astype(jnp.float32), valid)


def weighted_ppo(weight_fn, logp, old_logp, advantages, mask, clip_low, clip_high, aggregation,
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


def row_level(level: str, loss: str) -> str:
  """A loss's "token" | "sequence" weight level as a `behaviour_log_weight` level
  ("sequence" is the length-normalised geometric mean)."""
  _checks.check_choice(level, ("token", "sequence"), f"{loss} level")
  return "geometric" if level == "sequence" else "token"
