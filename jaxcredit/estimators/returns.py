"""Returns, GAE, TD(lambda), n-step and V-trace over LLM token masks.

All recursions run backwards over *valid* positions only: a masked position
(prompt, padding, tool output) is skipped, so "next" means the next valid
position, and after the last valid token the episode is terminal (V = 0,
A = 0). Inputs at masked positions are ignored (even NaN/Inf) and outputs
there are 0. Shapes: [B, T]. `method` picks the recurrence implementation
(`RECURRENCE_METHODS`); None picks the fastest for the backend.
"""

import math

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, sanitise
from jaxcredit.estimators.recurrence import masked_recurrence, next_carry, next_valid
from jaxcredit.logprobs import LOG_RATIO_BOUND


def _prepare(mask: Array, **arrays: Array) -> tuple[Array, ...]:
  """Validates [B, T] shapes; returns (valid, *sanitised float32 arrays)."""
  _checks.check_token_and_seq({**arrays, "mask": mask}, {})
  valid = as_bool(mask)
  return (valid, *(sanitise(x, valid) for x in arrays.values()))


def _check_discounts(**discounts: float) -> None:
  """gamma and lam must lie in [0, 1]."""
  for name, value in discounts.items():
    _checks.check_in_range(value, name, low=0.0, high=1.0)


def discounted_returns(
    rewards: Array, mask: Array, *, gamma: float, method: str | None = None
) -> Array:
  """Discounted reward-to-go over valid positions: ``G_t = r_t + gamma * G_next``.

  G_next is the return at the next valid position (0 after the last one).

  Args:
    rewards: ``[B, T]`` per-token rewards.
    mask: ``[B, T]`` policy actions; rewards elsewhere (even NaN) are ignored.
    gamma: the discount, in [0, 1].
    method: the recurrence's implementation, as `gae`'s (None: the backend's fastest).

  Returns:
    float32 ``[B, T]``, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes or gamma outside [0, 1].

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.discounted_returns(jnp.array([[0.0, 0.0, 1.0]]), jnp.ones((1, 3), bool),
    ...                               gamma=0.5)
    Array([[0.25, 0.5 , 1.  ]], dtype=float32)
  """
  _check_discounts(gamma=gamma)
  valid, rewards = _prepare(mask, rewards=rewards)
  return masked_recurrence(rewards, gamma, valid, method=method)


def gae(
    rewards: Array,
    values: Array,
    mask: Array,
    *,
    gamma: float,
    lam: float,
    method: str | None = None,
) -> tuple[Array, Array]:
  """Generalised advantage estimation (GAE; Schulman et al., 2016)::

    delta_t = r_t + gamma * V_next - V_t
    A_t     = delta_t + gamma * lam * A_next

  where "next" is the next valid position and V_next = A_next = 0 after the last valid
  token. Computed with a single recurrence: with C_t = gamma V_t + gamma lam A_t,
  A_t = (r_t - V_t) + C_next and C_t = gamma V_t + gamma lam (r_t - V_t) + gamma lam C_next,
  so V_next never has to be looked up separately.

  Args:
    rewards: ``[B, T]`` per-token rewards.
    values: ``[B, T]`` critic values V(s_t).
    mask: ``[B, T]`` policy actions; values at other positions (even NaN) are ignored.
    gamma: the discount, in [0, 1].
    lam: GAE's lambda, in [0, 1].
    method: "blocked" (blocks of steps as matrix products, fastest on CPU), "scan"
      (sequential) or "associative" (`lax.associative_scan`, O(log T) depth, for
      accelerators); None is the fastest for the backend. All give the same result.

  Returns:
    ``(advantages, returns)``, float32 ``[B, T]`` each, with ``returns = (A + V) * mask``;
    0 off the mask.

  Raises:
    ValueError: on mismatched shapes, gamma or lam outside [0, 1], or an unknown method.

  References:
    Schulman et al., 2016, "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", arXiv 1506.02438.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> rewards = jnp.array([[0.0, 0.0, 1.0]])
    >>> values = jnp.array([[0.5, 0.5, 0.5]])
    >>> advantages, returns = estimators.gae(rewards, values, jnp.ones((1, 3), bool),
    ...                                      gamma=1.0, lam=1.0)
    >>> advantages
    Array([[0.5, 0.5, 0.5]], dtype=float32)
  """
  _checks.check_token_and_seq({"rewards": rewards, "values": values, "mask": mask}, {})
  _check_discounts(gamma=gamma, lam=lam)
  valid = as_bool(mask)
  rewards, values = rewards.astype(jnp.float32), values.astype(jnp.float32)
  # Both expressions are linear in (r, V), so masking the result (rather than
  # the inputs first) keeps masked NaN/Inf out of outputs and gradients, and
  # lets XLA fuse each into one pass (measured 2x faster on CPU).
  carry_next = next_carry(
      jnp.where(valid, gamma * values + gamma * lam * (rewards - values), 0.0),
      gamma * lam, valid, method=method,
  )
  # returns = A + V = r + C_next. The advantages are read off the returns, so
  # C_next has one consumer and XLA fuses it into the returns' pass instead
  # of writing it to memory (one [B, T] pass fewer on CPU).
  returns = jnp.where(valid, rewards + carry_next, 0.0)
  return jnp.where(valid, returns - values, 0.0), returns


def lambda_returns(
    rewards: Array,
    values: Array,
    mask: Array,
    *,
    gamma: float,
    lam: float,
    method: str | None = None,
) -> Array:
  """TD(lambda) returns (Sutton & Barto, 2018, ch. 12)::

    G_t = r_t + gamma * ((1 - lam) * V_next + lam * G_next)

  with "next" and the terminal rule as in `gae`. Identical to A_gae + V, which is how it is
  computed.

  Args:
    rewards: ``[B, T]`` per-token rewards.
    values: ``[B, T]`` critic values V(s_t).
    mask: ``[B, T]`` policy actions.
    gamma: the discount, in [0, 1].
    lam: lambda, in [0, 1].
    method: the recurrence's implementation, as `gae`'s.

  Returns:
    float32 ``[B, T]``, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes, or gamma or lam outside [0, 1].

  References:
    Sutton and Barto, 2018, "Reinforcement Learning: An Introduction" (2nd ed.), ch. 12.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.lambda_returns(jnp.array([[0.0, 1.0]]), jnp.array([[0.5, 0.5]]),
    ...                           jnp.ones((1, 2), bool), gamma=1.0, lam=0.0)
    Array([[0.5, 1. ]], dtype=float32)
  """
  return gae(rewards, values, mask, gamma=gamma, lam=lam, method=method)[1]


def n_step_returns(
    rewards: Array,
    values: Array,
    mask: Array,
    *,
    n: int,
    gamma: float,
    method: str | None = None,
) -> Array:
  """n-step bootstrapped returns over valid positions::

    G_t = sum_{k<n} gamma^k r_{t_k} + gamma^n V_{t_n}

  where t_0 = t and t_k is the k-th valid position after t; terms past the last valid token
  are 0 (terminal). n = 1 is the TD(0) target; n >= T is the Monte-Carlo return.

  Args:
    rewards: ``[B, T]`` per-token rewards.
    values: ``[B, T]`` value estimates V_t.
    mask: ``[B, T]`` policy actions.
    n: the number of steps, a positive int.
    gamma: discount in ``[0, 1]``.
    method: recurrence method (`recurrence.METHODS`), None for the backend's default.

  Returns:
    float32 ``[B, T]``, 0 at masked positions.

  Raises:
    ValueError: when n is not a positive int, gamma is outside ``[0, 1]``, or shapes differ.

  References:
    Sutton and Barto, 2018, "Reinforcement Learning: An Introduction", 2nd ed., chapter 7.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> rewards = jnp.array([[0.0, 0.0, 1.0]])
    >>> values = jnp.array([[0.5, 0.5, 0.5]])
    >>> estimators.n_step_returns(rewards, values, jnp.ones((1, 3), bool), n=1, gamma=1.0)
    Array([[0.5, 0.5, 1. ]], dtype=float32)
  """
  if not isinstance(n, int) or n < 1:
    raise ValueError(f"n must be a positive int, got {n!r}.")
  _check_discounts(gamma=gamma)
  valid, rewards, values = _prepare(mask, rewards=rewards, values=values)
  # G^(k)_t = r_t + gamma * G^(k-1)_next, G^(0) = V.
  returns = values
  for _ in range(n):
    returns = jnp.where(valid, rewards + gamma * next_valid(returns, valid, method=method), 0.0)
  return returns


def vtrace(
    rewards: Array,
    values: Array,
    mask: Array,
    log_rhos: Array,
    *,
    gamma: float,
    lam: float = 1.0,
    clip_rho: float = 1.0,
    clip_c: float = 1.0,
    method: str | None = None,
) -> tuple[Array, Array]:
  """V-trace off-policy targets, as rlax computes them::

    rho_t = min(clip_rho, exp(log_rho_t)),   c_t = lam * min(clip_c, exp(log_rho_t))
    vs_t  = V_t + rho_t (r_t + gamma V_next - V_t) + gamma c_t (vs_next - V_next)
    pg_advantages_t = rho_t (r_t + gamma (lam vs_next + (1 - lam) V_next) - V_t)

  with next and terminal as in `gae` (V_next = vs_next = 0 after the last valid token).

  Args:
    rewards: ``[B, T]`` per-token rewards.
    values: ``[B, T]`` value estimates V_t.
    mask: ``[B, T]`` policy actions.
    log_rhos: ``[B, T]`` log pi(a_t) - log mu(a_t), target minus behaviour policy.
    gamma: discount in ``[0, 1]``.
    lam: trace coefficient in ``[0, 1]``.
    clip_rho: clip of the importance weight in the TD error, > 0.
    clip_c: clip of the trace coefficient, > 0.
    method: recurrence method (`recurrence.METHODS`), None for the backend's default.

  Returns:
    ``(vs, pg_advantages)``, float32 ``[B, T]`` each, 0 at masked positions.

  Raises:
    ValueError: on discounts outside ``[0, 1]``, clips <= 0, or mismatched shapes.

  References:
    Espeholt et al., 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
    Actor-Learner Architectures", arXiv 1802.01561.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> rewards, values = jnp.array([[0.0, 1.0]]), jnp.array([[0.5, 0.5]])
    >>> vs, pg = estimators.vtrace(rewards, values, jnp.ones((1, 2), bool), jnp.zeros((1, 2)),
    ...                            gamma=1.0)
    >>> vs, pg  # on-policy: the Monte-Carlo return and its advantage
    (Array([[1., 1.]], dtype=float32), Array([[0.5, 0.5]], dtype=float32))
  """
  _check_discounts(gamma=gamma, lam=lam)
  _checks.check_in_range(clip_rho, "clip_rho", low=0.0, low_open=True)
  _checks.check_in_range(clip_c, "clip_c", low=0.0, low_open=True)
  valid, rewards, values, log_rhos = _prepare(
      mask, rewards=rewards, values=values, log_rhos=log_rhos
  )
  # min(c, exp(x)) = exp(min(x, log c)): no overflow (nor NaN gradient) for any
  # finite log-ratio; an infinite clip saturates at importance_ratio's bound.
  clipped_ratio = lambda clip: jnp.exp(jnp.minimum(log_rhos, min(math.log(clip), LOG_RATIO_BOUND)))
  clipped_rhos = clipped_ratio(clip_rho)
  cs = lam * clipped_ratio(clip_c)
  value_next = next_valid(values, valid, method=method)
  deltas = jnp.where(valid, rewards + gamma * value_next - values, 0.0)
  # vs_t - V_t = rho_t delta_t + gamma c_t (vs_next - V_next).
  corrections = masked_recurrence(clipped_rhos * deltas, gamma * cs, valid, method=method)
  vs = jnp.where(valid, values + corrections, 0.0)
  vs_next = next_valid(vs, valid, method=method)
  q_estimate = rewards + gamma * (lam * vs_next + (1.0 - lam) * value_next)
  return vs, jnp.where(valid, clipped_rhos * (q_estimate - values), 0.0)
