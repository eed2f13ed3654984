"""Backward linear recurrences over the time axis, the engine of every return.

All returns in jaxcredit reduce to y_t = a_t + c_t * y_{t+1} (y_T = 0) over
[B, T] arrays, run right to left. Masked positions are skipped by giving them
a = 0, c = 1 (the carry passes through unchanged). Two implementations give
the same result:

  scan         lax.scan over time-major [T, B] data: T sequential steps, the
               least work; fastest on CPU.
  associative  lax.associative_scan: O(log T) depth, for accelerators and long T.

(A blocked variant - vectorised scans inside blocks of the time axis plus a
short scan across blocks - measured 2x slower than `scan` on CPU at
[64, 32768] and is not included.)
"""

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks

METHODS = ("scan", "associative")


def default_method() -> str:
  """'scan' on CPU, where sequential steps are cheap; 'associative' elsewhere."""
  return "scan" if jax.default_backend() == "cpu" else "associative"


def _scan(a: Array, c: Array) -> Array:
  def step(y_next, xs):
    a_t, c_t = xs
    y = a_t + c_t * y_next
    return y, y

  init = jnp.zeros(a.shape[:1], a.dtype)
  _, y = jax.lax.scan(step, init, (a.T, c.T), reverse=True)
  return y.T


def _compose(later, earlier):
  """(c, a) of applying `earlier` after `later`: y = a_e + c_e * (a_l + c_l * y')."""
  c_later, a_later = later
  c_earlier, a_earlier = earlier
  return c_earlier * c_later, a_earlier + c_earlier * a_later


def _associative(a: Array, c: Array) -> Array:
  _, y = jax.lax.associative_scan(_compose, (c, a), reverse=True, axis=1)
  return y


def linear_recurrence(a: Array, c: Array, *, method: str | None = None) -> Array:
  """y_t = a_t + c_t * y_{t+1}, y_T = 0, along axis 1 of [B, T] arrays.

  method: one of METHODS, or None for `default_method()`. Returns [B, T].
  """
  method = method or default_method()
  _checks.check_choice(method, METHODS, "recurrence method")
  return _scan(a, c) if method == "scan" else _associative(a, c)


def masked_recurrence(a: Array, coef: Array | float, valid: Array, *, method: str | None = None) -> Array:
  """y_t = a_t + coef_t * y_next over valid positions, "next" = next valid one.

  Invalid positions pass the carry through and output 0. `a` must already be
  sanitised (finite) at invalid positions.
  """
  coef = jnp.broadcast_to(jnp.asarray(coef, jnp.float32), a.shape)
  y = linear_recurrence(
      jnp.where(valid, a, 0.0), jnp.where(valid, coef, 1.0), method=method
  )
  return jnp.where(valid, y, 0.0)


def next_valid(x: Array, valid: Array, *, method: str | None = None) -> Array:
  """x at the first valid position strictly after t; 0 when there is none."""
  at_or_after = linear_recurrence(
      jnp.where(valid, x, 0.0), jnp.where(valid, 0.0, 1.0).astype(x.dtype), method=method
  )
  return jnp.pad(at_or_after[:, 1:], [(0, 0), (0, 1)])
