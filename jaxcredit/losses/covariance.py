"""Covariance-targeted policy losses against entropy collapse (Cui et al., 2025,
"The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models").

Entropy falls fastest through tokens whose log-prob and advantage covary
strongly: cov_t = (A_t - mean A) (log pi_t - mean log pi), means over valid
tokens of the batch (no gradient). Clip-Cov stops the gradient of a few such
tokens; KL-Cov adds a KL penalty on them.
"""

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit._masking import masked_mean, top_n_mask
from jaxcredit.losses._ratio import (Metrics, TokenRatios, check_clip, clipped_surrogate, fraction,
                                     token_ratio_loss)


def token_covariance(logp: Array, advantages: Array, valid: Array) -> Array:
  """The covariance of each token's log-prob and advantage::

    cov_t = (A_t - mean A)(log pi_t - mean log pi)

  means over valid tokens of the batch. No gradient flows through it.

  Args:
    logp: ``[B, T]`` log-probs, sanitised (finite at masked positions).
    advantages: ``[B, T]`` advantages, sanitised.
    valid: ``[B, T]`` bool, the valid tokens.

  Returns:
    float32 ``[B, T]``, 0 at invalid positions.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.losses import covariance
    >>> logp, adv = jnp.array([[-1.0, -3.0]]), jnp.array([[1.0, -1.0]])
    >>> covariance.token_covariance(logp, adv, jnp.ones((1, 2), bool))
    Array([[1., 1.]], dtype=float32)
  """
  logp, advantages = jax.lax.stop_gradient((logp, advantages))
  centred_adv = advantages - masked_mean(advantages, valid)
  centred_logp = logp - masked_mean(logp, valid)
  return jnp.where(valid, centred_adv * centred_logp, 0.0)


def _n_selected(valid: Array, fraction: float) -> Array:
  """max(1, floor(fraction * n_valid)) tokens."""
  return jnp.maximum(jnp.floor(fraction * jnp.sum(valid)), 1.0)


def clip_cov_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    cov_fraction: float = 2e-4,
    cov_low: float = 1.0,
    cov_high: float = 5.0,
    key: Array | None = None,
    aggregation: str = "token-mean",
) -> tuple[Array, Metrics]:
  """Clip-Cov: PPO-clip, with the gradient of a few high-covariance tokens cut.

  Among valid tokens not already clipped by PPO with ``cov_low < cov_t < cov_high``,
  ``max(1, floor(cov_fraction * n_valid))`` are chosen, uniformly at random under `key` (as
  the paper) or the highest-covariance ones when key is None (deterministic), and their
  token loss is set to 0.

  Args:
    logp: ``[B, T]`` log-probs under the policy being updated.
    old_logp: ``[B, T]`` log-probs under the policy the ratio is taken against.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    clip_low: the ratio's lower clip, 1 - clip_low.
    clip_high: the ratio's upper clip, 1 + clip_high.
    cov_fraction: the fraction of valid tokens whose gradient is cut.
    cov_low: the covariance's lower bound for eligible tokens.
    cov_high: the covariance's upper bound for eligible tokens.
    key: a PRNG key for a random choice, or None for the highest covariance.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and cov_clipfrac, clipfrac, approx_kl and ratio
    statistics.

  Raises:
    ValueError: on mismatched shapes, invalid clips or an unknown aggregation.

  References:
    Cui et al., 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models", arXiv 2505.22617.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> loss, metrics = losses.clip_cov_loss(logp, old, adv, mask, cov_low=-1.0)
    >>> round(float(loss), 4)
    -0.6
    >>> round(float(metrics['cov_clipfrac']), 4)
    0.5
  """
  check_clip(clip_low, clip_high)

  def formula(t: TokenRatios):
    loss_tok, is_clipped = clipped_surrogate(t.ratio, t.advantages, clip_low, clip_high)
    cov = token_covariance(t.logp, t.advantages, t.valid)
    eligible = t.valid & ~is_clipped & (cov > cov_low) & (cov < cov_high)
    scores = cov if key is None else jax.random.uniform(key, cov.shape)
    selected = top_n_mask(scores, eligible, _n_selected(t.valid, cov_fraction))
    metrics = {
        "cov_clipfrac": fraction(selected, t.valid),
        "clipfrac": fraction(is_clipped, t.valid)
    }
    return jnp.where(selected, 0.0, loss_tok), metrics

  return token_ratio_loss(formula, logp, old_logp, advantages, mask, aggregation)


def kl_cov_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    *,
    kl_fraction: float = 2e-4,
    kl_coef: float = 1.0,
    aggregation: str = "token-mean",
) -> tuple[Array, Metrics]:
  """KL-Cov: the unclipped surrogate plus a KL penalty on the tokens of highest covariance::

    l_t = -A_t r_t + kl_coef |log pi_t - log pi_old,t| [t selected]

  on the ``max(1, floor(kl_fraction * n_valid))`` valid tokens of highest covariance.

  Args:
    logp: ``[B, T]`` log-probs under the policy being updated.
    old_logp: ``[B, T]`` log-probs under the policy the ratio is taken against.
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.
    kl_fraction: the fraction of valid tokens penalised.
    kl_coef: the penalty's coefficient.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``(loss, metrics)``: a float32 scalar, and kl_cov_fraction, abs_kl (mean |log-ratio|),
    approx_kl and ratio statistics.

  Raises:
    ValueError: on mismatched shapes or an unknown aggregation.

  References:
    Cui et al., 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models", arXiv 2505.22617.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> logp = jnp.log(jnp.array([[0.5, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2), bool)
    >>> loss, metrics = losses.kl_cov_loss(logp, old, adv, mask, kl_fraction=0.5)
    >>> round(float(loss), 4)
    -1.4
    >>> round(float(metrics['kl_cov_fraction']), 4), round(float(metrics['abs_kl']), 4)
    (0.5, 0.2939)
  """

  def formula(t: TokenRatios):
    selected = top_n_mask(token_covariance(t.logp, t.advantages, t.valid), t.valid,
                          _n_selected(t.valid, kl_fraction))
    abs_log_ratio = jnp.abs(t.log_ratio)
    loss_tok = -t.advantages * t.ratio + jnp.where(selected, kl_coef * abs_log_ratio, 0.0)
    return loss_tok, {
        "kl_cov_fraction": fraction(selected, t.valid),
        "abs_kl": masked_mean(abs_log_ratio, t.valid)
    }

  return token_ratio_loss(formula, logp, old_logp, advantages, mask, aggregation)
