"""Token-level credit that needs no extra model calls: normalisation, implicit
and process rewards, the optimal token baseline, entropy and surprisal weights.

Shapes: [B, T] token arrays with `mask`; values at masked positions are
ignored (even NaN) and outputs there are 0.
"""

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import (
    as_bool,
    masked_mean,
    safe_divide,
    safe_sqrt,
    sanitise,
    scale_down,
    top_n_mask,
)


def whiten(x: Array, mask: Array, *, shift_mean: bool = True, eps: float = 1e-8) -> Array:
  """Whitening over valid positions: ``(x - mean) / sqrt(var + eps)``.

  The mean and unbiased (ddof = 1) variance are taken over the valid entries; the variance
  is 0 when fewer than 2 are valid (then the output is 0 if eps == 0). Scale-invariant for
  any finite x.

  Args:
    x: any shape.
    mask: the shape of `x`, the valid entries.
    shift_mean: False adds the mean back (only the scale changes).
    eps: added to the variance, >= 0.

  Returns:
    float32, the shape of `x`, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes or a negative eps.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.whiten(jnp.array([1.0, 2.0, 3.0, 100.0]),
    ...                   jnp.array([True, True, True, False]), eps=0.0)
    Array([-1.,  0.,  1.,  0.], dtype=float32)
  """
  _checks.check_same_shape(x=x, mask=mask)
  _checks.check_in_range(eps, "eps", low=0.0)
  valid = as_bool(mask)
  x = sanitise(x, valid)
  # Work on (x / 2 - anchor) / scale, anchor the first valid x / 2 (exact zeros
  # for equal values, no overflow for huge ones: see group._centred), so
  # x - mean = 2 scale (scaled - scaled_mean).
  half = 0.5 * x
  anchor = half.reshape(-1)[jnp.argmax(valid.reshape(-1))]
  scaled, scale = scale_down(jnp.where(valid, half - anchor, 0.0))
  count = jnp.sum(valid, dtype=jnp.float32)
  scaled_mean = masked_mean(scaled, valid)
  centred = jnp.where(valid, scaled - scaled_mean, 0.0)
  variance = safe_divide(jnp.sum(centred**2), count - 1.0) * (count > 1)
  # 0 where var + eps == 0.
  out = safe_divide(centred, safe_sqrt(variance + eps / (2.0 * scale) ** 2))
  if not shift_mean:
    out = out + 2.0 * (anchor + scaled_mean * scale)
  return jnp.where(valid, out, 0.0)


def implicit_process_rewards(prm_logp: Array, ref_logp: Array, mask: Array, *,
                             beta: float) -> Array:
  """Implicit PRM token rewards (PRIME)::

    r_t = beta (log pi_prm(a_t) - log pi_ref(a_t))

  Args:
    prm_logp: ``[B, T]`` log-probs of the sampled tokens under an outcome-reward-trained LM.
    ref_logp: ``[B, T]`` the same under its reference.
    mask: ``[B, T]`` policy actions.
    beta: the implicit reward's scale, > 0.

  Returns:
    float32 ``[B, T]``, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes or beta <= 0.

  References:
    Cui et al., 2025, "Process Reinforcement through Implicit Rewards", arXiv 2502.01456.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.implicit_process_rewards(jnp.array([[-1.0, -2.0]]), jnp.array([[-2.0, -2.0]]),
    ...                                     jnp.ones((1, 2), bool), beta=0.5)
    Array([[0.5, 0. ]], dtype=float32)
  """
  _checks.check_token_and_seq({"prm_logp": prm_logp, "ref_logp": ref_logp, "mask": mask}, {})
  _checks.check_in_range(beta, "beta", low=0.0, low_open=True)
  valid = as_bool(mask)
  return jnp.where(valid, beta * (sanitise(prm_logp, valid) - sanitise(ref_logp, valid)), 0.0)


def prm_token_rewards(
    step_scores: Array,
    step_ends: Array,
    mask: Array,
    *,
    step_mask: Array | None = None,
    form: str = "sum",
    temperature: float = 0.1,
) -> Array:
  """Places process-reward-model step scores on the tokens that end each step::

    form="sum": token reward at step end = the step's score, so the return is
                the sum of the future step scores.
    form="min": PURE min-form credit: scores are first reweighted by
                softmax_s(-score / temperature) over each row's valid steps, so the
                return from the first step approximates the *minimum* step score as
                temperature -> 0 (no reward hacking by padding many good steps).

  A step ending at a masked token or outside ``[0, T)`` is dropped.

  Args:
    step_scores: ``[B, S]`` one score per step.
    step_ends: ``[B, S]`` int, the token index of each step's last token.
    mask: ``[B, T]`` policy actions.
    step_mask: ``[B, S]`` the valid steps; None for all.
    form: "sum" or "min".
    temperature: the softmax temperature of the min form, > 0.

  Returns:
    float32 ``[B, T]``, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes or batch sizes, or an unknown form.

  References:
    Cheng et al., 2025, "Stop Summation: Min-Form Credit Assignment Is All Process Reward
    Model Needs for Reasoning", arXiv 2504.15275.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.prm_token_rewards(jnp.array([[0.5, 1.0]]), jnp.array([[1, 3]]),
    ...                               jnp.ones((1, 4), bool))
    Array([[0. , 0.5, 0. , 1. ]], dtype=float32)
  """
  _checks.check_rank(step_scores, 2, "step_scores")
  _checks.check_rank(mask, 2, "mask")
  _checks.check_same_shape(step_scores=step_scores, step_ends=step_ends, step_mask=step_mask)
  _checks.check_choice(form, ("sum", "min"), "PRM credit form")
  if step_scores.shape[0] != mask.shape[0]:
    raise ValueError(
        f"step_scores{list(step_scores.shape)} and mask{list(mask.shape)} differ in B.")
  steps_valid = jnp.ones(step_scores.shape, bool) if step_mask is None else as_bool(step_mask)
  scores = sanitise(step_scores, steps_valid)
  if form == "min":
    logits = jnp.where(steps_valid, -scores / temperature, -jnp.inf)
    weights = jnp.where(steps_valid, jax.nn.softmax(logits, axis=1), 0.0)
    weights = jnp.where(jnp.any(steps_valid, axis=1, keepdims=True), weights, 0.0)
    scores = weights * scores
  length = mask.shape[1]
  ends = jnp.where(steps_valid, step_ends, length)  # out of range -> dropped
  rows = jnp.broadcast_to(jnp.arange(mask.shape[0])[:, None], ends.shape)
  placed = jnp.zeros(mask.shape, jnp.float32).at[rows, ends].add(scores, mode="drop")
  return jnp.where(as_bool(mask), placed, 0.0)


def optimal_token_baseline_advantages(
    returns: Array,
    logprobs: Array,
    sum_pi_squared: Array,
    mask: Array,
    *,
    group_size: int,
    eps: float = 1e-8,
) -> Array:
  """Optimal Token Baseline (OTB): a per-token baseline weighted by the realised gradient
  energy of the prefix.

  The energy is estimated with the logit-gradient proxy
  ``||e_a - pi||^2 = 1 - 2 pi_a + sum pi^2``::

    W_t = sum_{j <= t, valid} (1 - 2 p_j + sum_pi_squared_j)
    b_t = sum_{i in g, valid at t} G_t^i W_t^i / (sum_{i in g, valid at t} W_t^i + eps)
    A_t = G_t - b_t

  Rows of a group are aligned by column.

  Args:
    returns: ``[B, T]`` returns-to-go G_t.
    logprobs: ``[B, T]`` log pi of the sampled tokens.
    sum_pi_squared: ``[B, T]`` sum over the vocabulary of pi^2
      (`jaxcredit.logprobs.token_sum_probs_squared`).
    mask: ``[B, T]`` policy actions.
    group_size: G, responses per prompt.
    eps: added to the weights' sum.

  Returns:
    float32 ``[B, T]``, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes or when `group_size` does not divide B.

  References:
    Li et al., 2026, "Optimal Token Baseline", arXiv 2602.07078.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> returns = jnp.array([[1.0, 1.0], [0.0, 0.0]])
    >>> logprobs = jnp.log(jnp.full((2, 2), 0.5))
    >>> estimators.optimal_token_baseline_advantages(returns, logprobs, jnp.full((2, 2), 0.5),
    ...                                              jnp.ones((2, 2), bool), group_size=2)
    Array([[ 0.5,  0.5],
           [-0.5, -0.5]], dtype=float32)
  """
  arrays = {
      "returns": returns,
      "logprobs": logprobs,
      "sum_pi_squared": sum_pi_squared,
      "mask": mask
  }
  _checks.check_token_and_seq(arrays, {})
  _checks.check_group_size(mask.shape[0], group_size)
  valid = as_bool(mask)
  returns = sanitise(returns, valid)
  energy = 1.0 - 2.0 * jnp.exp(sanitise(logprobs, valid)) + sanitise(sum_pi_squared, valid)
  weights = jnp.where(valid, jnp.cumsum(jnp.where(valid, energy, 0.0), axis=1), 0.0)
  group_shape = (mask.shape[0] // group_size, group_size, mask.shape[1])
  numerator = jnp.sum((returns * weights).reshape(group_shape), axis=1, keepdims=True)
  denominator = jnp.sum(weights.reshape(group_shape), axis=1, keepdims=True) + eps
  baseline = jnp.broadcast_to(numerator / denominator, group_shape).reshape(mask.shape)
  return jnp.where(valid, returns - baseline, 0.0)


def high_entropy_mask(entropy: Array, mask: Array, *, rho: float = 0.2) -> Array:
  """The top-`rho` fraction of valid tokens by entropy, batch-wide: the forking tokens the
  80/20 rule updates.

  Selects ``ceil(rho * n_valid)`` tokens, ties broken by position.

  Args:
    entropy: ``[B, T]`` the policy's entropy at each token.
    mask: ``[B, T]`` policy actions.
    rho: the fraction kept, in ``(0, 1]``.

  Returns:
    bool ``[B, T]``, a subset of `mask`.

  Raises:
    ValueError: on mismatched shapes or rho outside ``(0, 1]``.

  References:
    Wang et al., 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
    Reinforcement Learning for LLM Reasoning", arXiv 2506.01939.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import token_credit
    >>> token_credit.high_entropy_mask(jnp.array([[0.1, 2.0, 0.5, 9.0]]),
    ...                                jnp.array([[True, True, True, False]]), rho=0.3)
    Array([[False,  True, False, False]], dtype=bool)
  """
  _checks.check_token_and_seq({"entropy": entropy, "mask": mask}, {})
  _checks.check_in_range(rho, "rho", low=0.0, high=1.0, low_open=True)
  valid = as_bool(mask)
  return top_n_mask(entropy, valid, jnp.ceil(rho * jnp.sum(valid)))


def surprisal_weights(logprobs: Array, mask: Array) -> Array:
  """Per-token weights proportional to the surprisal ``-log pi(a_t)``, mean 1 over valid tokens.

  Upweights tokens the policy found unlikely, where credit is most informative.

  Args:
    logprobs: ``[B, T]`` log pi of the sampled tokens.
    mask: ``[B, T]`` policy actions.

  Returns:
    float32 ``[B, T]``, 0 at masked positions; all ones on valid tokens when every surprisal
    is 0.

  Raises:
    ValueError: on mismatched shapes.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> logprobs = jnp.log(jnp.array([[0.5, 0.25]]))
    >>> estimators.surprisal_weights(logprobs, jnp.ones((1, 2), bool)).round(4)
    Array([[0.6667, 1.3333]], dtype=float32)
  """
  _checks.check_token_and_seq({"logprobs": logprobs, "mask": mask}, {})
  valid = as_bool(mask)
  surprisal = -sanitise(logprobs, valid)
  mean = masked_mean(surprisal, valid)
  weights = jnp.where(mean > 0, safe_divide(surprisal, mean), 1.0)
  return jnp.where(valid, weights, 0.0)
