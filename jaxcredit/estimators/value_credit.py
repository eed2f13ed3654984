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
  """A_t = V(next valid position) - V_t, and R - V_t at the last action.

  values: [B, T] V(s_t) at action positions; rewards: [B]; mask: [B, T].
  Equals gae(outcome rewards, values, mask, gamma=1, lam=0). Returns [B, T],
  0 where mask is False.
  """
  advantages, _ = returns.gae(outcome_to_tokens(rewards, mask), values, mask, gamma=1.0, lam=0.0)
  return advantages


def _at_or_before(x: Array, valid: Array) -> Array:
  """x at the last valid position <= t (0 when there is none)."""
  fx, fv = x[:, ::-1], valid[:, ::-1]
  return jnp.where(fv, fx, next_valid(fx, fv))[:, ::-1]


def segment_endpoints(values: Array, evaluated: Array, rewards: Array,
                      mask: Array) -> tuple[Array, Array]:
  """(V at the segment's start, V at the next segment's start or R) for every
  action; segments start at the `evaluated` actions. All [B, T] (rewards [B]);
  0 where mask is False."""
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

  Segments start at the `evaluated` positions (where V is known); token t in
  the segment [e_j, e_{j+1}) gets V(e_{j+1}) - V(e_j), the last segment
  R - V(e_last). values, evaluated, mask: [B, T]; rewards: [B]. With
  evaluated == mask this is `values_to_advantages`. A row's first action
  should be evaluated; tokens before a row's first evaluated position get
  V(e_1) - 0.
  """
  start, end = segment_endpoints(values, evaluated, rewards, mask)
  return end - start


def first_value(values: Array, mask: Array) -> Array:
  """[B] V at each row's first action (V(x), the prompt's value); 0 for empty rows."""
  valid = as_bool(mask)
  first = jnp.argmax(valid, axis=1)
  picked = jnp.take_along_axis(sanitise(values.astype(jnp.float32), valid), first[:, None],
                               axis=1)[:, 0]
  return jnp.where(valid.any(axis=1), picked, 0.0)


def sequence_advantages(values: Array, rewards: Array, mask: Array) -> Array:
  """R - V(x) on every token: the best sequence-level credit (an exact baseline)."""
  return broadcast_to_tokens(rewards - first_value(values, mask), mask)
