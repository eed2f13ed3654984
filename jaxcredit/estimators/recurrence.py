"""Backward linear recurrences over valid positions, the engine of every return.

Every return in jaxcredit reduces to one recurrence over [B, T] arrays, run
right to left, that skips masked positions:

  y_t = a_t + c_t * y_{t+1}   where valid_t,
  y_t = y_{t+1}               where not valid_t (the carry passes through),
  y_T = 0.

Three implementations give the same result:
  blocked      for a scalar coefficient g (GAE's gamma * lam, discounting):
               the time axis cut into blocks of K <= 32 steps. With P_t the
               number of valid steps before t in its block,
                 y_t = g^-P_t sum_{s >= t in block} g^P_s a_s
                       + g^(P_end - P_t) y_(start of next block),
               so each block is one [K, K] triangular matrix product, P_t a
               popcount of the block's valid bits, and only a short scan over
               the T / K blocks is sequential. No [B, T] transpose, no T-step
               loop: the fastest on CPU. K is chosen so that g^-K stays below
               1e30 (float32 range); a coefficient too small for K = 2, or an
               array of coefficients, runs `scan`.
  scan         lax.scan over time-major data: T sequential steps of one
               multiply-add on [B].
  associative  lax.associative_scan: O(log T) depth, for accelerators and long T.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxcredit import _checks

METHODS = ("blocked", "scan", "associative")
_BLOCKS = (32, 16, 8, 4, 2)  # block sizes K, largest first; 32 valid bits fit a uint32
_LARGEST_SCALE = 1e30  # g^-K above this would lose float32 range


def default_method() -> str:
  """'blocked' on CPU, where it is fastest (bench.estimators); 'associative' elsewhere."""
  return "blocked" if jax.default_backend() == "cpu" else "associative"


def _scan(a: Array, c: Array) -> Array:
  def step(y_next, x):
    a_t, c_t = x
    y = a_t + c_t * y_next
    return y, y

  _, y = jax.lax.scan(step, jnp.zeros(a.shape[:1], a.dtype), (a.T, c.T), reverse=True)
  return y.T


def _block_size(coef) -> int | None:
  """The largest K in _BLOCKS with coef^-K <= _LARGEST_SCALE, for a Python scalar
  coef in (0, 1]; None otherwise (an array, or too small a coefficient)."""
  if not isinstance(coef, (int, float)) or not 0.0 < coef <= 1.0:
    return None
  return next((k for k in _BLOCKS if -k * math.log(coef) <= math.log(_LARGEST_SCALE)), None)


def _blocked(a: Array, g: float, valid: Array, size: int) -> Array:
  """pass_through_recurrence with scalar coefficient g over blocks of `size` (module docstring)."""
  b, t = a.shape
  n = -(-t // size)
  a = jnp.pad(a, [(0, 0), (0, n * size - t)]).reshape(b, n, size)
  valid = jnp.pad(valid, [(0, 0), (0, n * size - t)]).reshape(b, n, size)
  steps = jnp.arange(size, dtype=jnp.uint32)
  bits = jnp.sum(jnp.where(valid, jnp.uint32(1) << steps, jnp.uint32(0)), axis=-1,
                 dtype=jnp.uint32)  # [B, n]: the block's valid steps as bits
  before = jax.lax.population_count(bits[..., None] & ((jnp.uint32(1) << steps) - 1))
  log_g = jnp.float32(math.log(g))
  weight = jnp.exp(before.astype(jnp.float32) * log_g)  # g^P_t, in [g^K, 1]
  suffix = jnp.asarray(np.tril(np.ones((size, size))), jnp.float32)  # [s, t]: s >= t
  sums = jnp.matmul(weight * a, suffix, precision=jax.lax.Precision.HIGHEST)
  decay = jnp.exp(jax.lax.population_count(bits).astype(jnp.float32) * log_g)  # g^P_end

  def block(y_next, x):  # y at the start of each block, right to left
    start, block_decay = x
    return start + block_decay * y_next, y_next

  _, after = jax.lax.scan(block, jnp.zeros((b,), a.dtype), (sums[..., 0].T, decay.T),
                          reverse=True)  # after[j]: y at the start of block j + 1
  y = (sums + decay[..., None] * after.T[..., None]) / weight
  return y.reshape(b, n * size)[:, :t]


def _compose(later, earlier):
  """(c, a) of applying `earlier` after `later`: y = a_e + c_e * (a_l + c_l * y')."""
  c_later, a_later = later
  c_earlier, a_earlier = earlier
  return c_earlier * c_later, a_earlier + c_earlier * a_later


def _associative(a: Array, c: Array) -> Array:
  _, y = jax.lax.associative_scan(_compose, (c, a), reverse=True, axis=1)
  return y


def pass_through_recurrence(
    a: Array, coef: Array | float, valid: Array, *, method: str | None = None
) -> Array:
  """y with y_t = a_t + coef_t y_{t+1} at valid t, y_{t+1} elsewhere, y_T = 0.

  a: [B, T] float32, finite (sanitised) everywhere; coef: a scalar or [B, T];
  valid: [B, T] bool. method: one of METHODS, or None for `default_method()`.
  Returns y [B, T] at every position (masked ones hold the carried value).
  """
  method = method or default_method()
  _checks.check_choice(method, METHODS, "recurrence method")
  # A masked step is the identity map: a = 0, c = 1.
  a = jnp.where(valid, a, 0.0)
  if method == "blocked":
    size = _block_size(coef)
    if size is not None:
      return _blocked(a, float(coef), valid, size)
    method = "scan"
  c = jnp.where(valid, jnp.asarray(coef, a.dtype), 1.0)
  return (_scan if method == "scan" else _associative)(a, c)


def shift_left(y: Array) -> Array:
  """y_{t+1} along axis 1, with 0 past the end: with y from
  `pass_through_recurrence`, the carry that position t sees from the next
  valid position."""
  return jnp.pad(y[:, 1:], [(0, 0), (0, 1)])


def masked_recurrence(
    a: Array, coef: Array | float, valid: Array, *, method: str | None = None
) -> Array:
  """y_t = a_t + coef_t * y_next over valid positions ("next" = next valid one);
  0 at invalid positions."""
  return jnp.where(valid, pass_through_recurrence(a, coef, valid, method=method), 0.0)


def next_valid(x: Array, valid: Array, *, method: str | None = None) -> Array:
  """x at the first valid position strictly after t; 0 when there is none."""
  return shift_left(pass_through_recurrence(jnp.where(valid, x, 0.0), 0.0, valid, method=method))
