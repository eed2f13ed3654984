"""Token credit from state values V(s_t) known at some positions (Monte-Carlo
rollouts, an exact oracle): the pure part of VinePPO and of the lab's oracles.

With gamma = 1 and one outcome reward R per response, the advantage of the
action at t is A_t = V(s_{t+1}) - V(s_t), with V(s_L) := R after the last
action (so sum_t A_t = R - V(s_0): the credit telescopes).
"""

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, sanitise
from jaxcredit.estimators import returns
from jaxcredit.estimators.group import broadcast_to_tokens, outcome_to_tokens
from jaxcredit.estimators.recurrence import next_valid


def values_to_advantages(values: Array, rewards: Array, mask: Array) -> Array:
  """Advantages from state values::

    A_t = V(next valid position) - V_t,    and R - V_t at the last action

  Equals ``gae(outcome rewards, values, mask, gamma=1, lam=0)``.

  Args:
    values: ``[B, T]`` V(s_t) at action positions.
    rewards: ``[B]`` outcome rewards.
    mask: ``[B, T]`` policy actions.

  Returns:
    float32 ``[B, T]``, 0 where mask is False.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import value_credit
    >>> value_credit.values_to_advantages(jnp.array([[0.5, 0.75, 0.0]]), jnp.array([1.0]),
    ...                                   jnp.array([[True, True, False]]))
    Array([[0.25, 0.25, 0.  ]], dtype=float32)
  """
  advantages, _ = returns.gae(outcome_to_tokens(rewards, mask), values, mask, gamma=1.0, lam=0.0)
  return advantages


def _at_or_before(x: Array, valid: Array) -> Array:
  """x at the last valid position <= t (0 when there is none)."""
  fx, fv = x[:, ::-1], valid[:, ::-1]
  return jnp.where(fv, fx, next_valid(fx, fv))[:, ::-1]


def segment_endpoints(values: Array, evaluated: Array, rewards: Array,
                      mask: Array) -> tuple[Array, Array]:
  """The values at both ends of each action's segment; segments start at the `evaluated`
  actions.

  Args:
    values: ``[B, T]`` V at the evaluated positions (ignored elsewhere).
    evaluated: ``[B, T]`` bool, the positions where V is known.
    rewards: ``[B]`` outcome rewards (the value after the last action).
    mask: ``[B, T]`` policy actions.

  Returns:
    ``(start, end)``, float32 ``[B, T]`` each: V at the segment's start and V at the next
    segment's start (R for the last segment); 0 where mask is False.

  Raises:
    ValueError: on mismatched shapes.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import value_credit
    >>> values = jnp.array([[0.25, 0.0, 0.75, 0.0]])
    >>> evaluated = jnp.array([[True, False, True, False]])
    >>> start, end = value_credit.segment_endpoints(values, evaluated, jnp.array([1.0]),
    ...                                             jnp.ones((1, 4), bool))
    >>> start
    Array([[0.25, 0.25, 0.75, 0.75]], dtype=float32)
    >>> end
    Array([[0.75, 0.75, 1.  , 1.  ]], dtype=float32)
  """
  _checks.check_same_shape(values=values, evaluated=evaluated, mask=mask)
  _checks.check_token_and_seq({"mask": mask}, {"rewards": rewards})
  valid = as_bool(mask)
  points = as_bool(evaluated) & valid
  values = sanitise(values.astype(jnp.float32), points)
  start = _at_or_before(values, points)
  has_next = next_valid(jnp.ones_like(values), points) > 0
  end = jnp.where(has_next, next_valid(values, points), rewards.astype(jnp.float32)[:, None])
  return jnp.where(valid, start, 0.0), jnp.where(valid, end, 0.0)


def segment_advantages(values: Array, evaluated: Array, rewards: Array, mask: Array) -> Array:
  """Segment credit copied to every token of the segment (VinePPO).

  Segments start at the `evaluated` positions (where V is known); token t in the segment
  ``[e_j, e_{j+1})`` gets ``V(e_{j+1}) - V(e_j)``, the last segment ``R - V(e_last)``. With
  evaluated == mask this is `values_to_advantages`. A row's first action should be
  evaluated; tokens before a row's first evaluated position get ``V(e_1) - 0``.

  Args:
    values: ``[B, T]`` V at the evaluated positions (ignored elsewhere).
    evaluated: ``[B, T]`` bool, the positions where V is known.
    rewards: ``[B]`` outcome rewards.
    mask: ``[B, T]`` policy actions.

  Returns:
    float32 ``[B, T]``, 0 where mask is False.

  Raises:
    ValueError: on mismatched shapes.

  References:
    Kazemnejad et al., 2024, "VinePPO: Unlocking RL Potential For LLM Reasoning Through
    Refined Credit Assignment", arXiv 2410.01679.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import value_credit
    >>> values = jnp.array([[0.25, 0.0, 0.75, 0.0]])
    >>> evaluated = jnp.array([[True, False, True, False]])
    >>> value_credit.segment_advantages(values, evaluated, jnp.array([1.0]), jnp.ones((1, 4), bool))
    Array([[0.5 , 0.5 , 0.25, 0.25]], dtype=float32)
  """
  start, end = segment_endpoints(values, evaluated, rewards, mask)
  return end - start


def first_value(values: Array, mask: Array) -> Array:
  """V at each row's first action: V(x), the prompt's value.

  Args:
    values: ``[B, T]`` state values.
    mask: ``[B, T]`` policy actions.

  Returns:
    float32 ``[B]``; 0 for empty rows.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import value_credit
    >>> value_credit.first_value(jnp.array([[9.0, 0.25, 0.5], [1.0, 2.0, 3.0]]),
    ...                          jnp.array([[False, True, True], [False, False, False]]))
    Array([0.25, 0.  ], dtype=float32)
  """
  valid = as_bool(mask)
  first = jnp.argmax(valid, axis=1)
  picked = jnp.take_along_axis(sanitise(values.astype(jnp.float32), valid), first[:, None],
                               axis=1)[:, 0]
  return jnp.where(valid.any(axis=1), picked, 0.0)


def sequence_advantages(values: Array, rewards: Array, mask: Array) -> Array:
  """``R - V(x)`` on every token: the best sequence-level credit (an exact baseline).

  Args:
    values: ``[B, T]`` state values; V(x) is read at each row's first action.
    rewards: ``[B]`` outcome rewards.
    mask: ``[B, T]`` policy actions.

  Returns:
    float32 ``[B, T]``, 0 where mask is False.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import value_credit
    >>> value_credit.sequence_advantages(jnp.array([[0.25, 0.5]]), jnp.array([1.0]),
    ...                                  jnp.ones((1, 2), bool))
    Array([[0.75, 0.75]], dtype=float32)
  """
  return broadcast_to_tokens(rewards - first_value(values, mask), mask)
