"""Per-token KL estimators between the policy and a reference policy."""

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, sanitise
from jaxcredit.logprobs import LOG_RATIO_BOUND

KL_KINDS = ("k1", "k2", "k3")


def kl_penalty(logp: Array, ref_logp: Array, *, kind: str) -> Array:
  """Monte-Carlo estimators of KL(pi || ref) from sampled tokens (Schulman, 2020).

  With d = logp - ref_logp::

    k1 = d,   k2 = d^2 / 2,   k3 = exp(-d) + d - 1

  k1 is unbiased, k3 unbiased and non-negative, k2 biased with low variance. k3 takes d
  clipped to +-LOG_RATIO_BOUND (20, as verl's low_var_kl), so it stays finite, with a finite
  gradient, for any finite d.

  Args:
    logp: ``[B, T]`` (any shape) log-probs of the sampled tokens under pi.
    ref_logp: the same shape, under the reference.
    kind: "k1", "k2" or "k3".

  Returns:
    float32, the shape of `logp`.

  Raises:
    ValueError: for an unknown kind or mismatched shapes.

  References:
    J. Schulman, 2020, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> losses.kl_penalty(jnp.array([0.0, -1.0]), jnp.array([0.0, 0.0]), kind="k2")
    Array([0. , 0.5], dtype=float32)
  """
  _checks.check_same_shape(logp=logp, ref_logp=ref_logp)
  _checks.check_choice(kind, KL_KINDS, "KL kind")
  d = logp.astype(jnp.float32) - ref_logp.astype(jnp.float32)
  if kind == "k1":
    return d
  if kind == "k2":
    return 0.5 * d**2
  d = jnp.clip(d, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
  return jnp.exp(-d) + d - 1.0


def kl_reward_shaping(token_rewards: Array, logp: Array, ref_logp: Array, mask: Array, *,
                      coef: float, kind: str = "k1") -> Array:
  """KL as a reward penalty::

    r'_t = r_t - coef * kl_kind(logp_t, ref_logp_t)

  on valid tokens. Feed the result to a return-based estimator as `Rollout.token_rewards`.

  Args:
    token_rewards: ``[B, T]`` per-token rewards.
    logp: ``[B, T]`` log-probs under the policy.
    ref_logp: ``[B, T]`` log-probs under the reference.
    mask: ``[B, T]`` policy actions.
    coef: the penalty's coefficient.
    kind: the estimator of `kl_penalty`.

  Returns:
    float32 ``[B, T]``, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes or an unknown kind.

  References:
    Ziegler et al., 2019, "Fine-Tuning Language Models from Human Preferences",
    arXiv 1909.08593; Ouyang et al., 2022, "Training language models to follow instructions
    with human feedback", arXiv 2203.02155; Hu, 2025, "REINFORCE++", arXiv 2501.03262.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> losses.kl_reward_shaping(jnp.array([[0.0, 1.0]]), jnp.array([[-1.0, -1.0]]),
    ...                          jnp.array([[-2.0, -1.0]]), jnp.ones((1, 2), bool), coef=0.1)
    Array([[-0.1,  1. ]], dtype=float32)
  """
  _checks.check_token_and_seq(
      {"token_rewards": token_rewards, "logp": logp, "ref_logp": ref_logp, "mask": mask}, {}
  )
  valid = as_bool(mask)
  kl = kl_penalty(sanitise(logp, valid), sanitise(ref_logp, valid), kind=kind)
  return jnp.where(valid, sanitise(token_rewards, valid) - coef * kl, 0.0)
