"""Backward linear recurrences over valid positions, the engine of every return.

Every return in jaxcredit reduces to one recurrence over [B, T] arrays, run
right to left, that skips masked positions:

  y_t = a_t + c_t * y_{t+1}   where valid_t,
  y_t = y_{t+1}               where not valid_t (the carry passes through),
  y_T = 0.

`next_carry` returns y_{t+1}, the value position t receives from its right
(what GAE's returns and `next_valid` need); `pass_through_recurrence` returns
y_t = a_t + c_t y_{t+1}. Three implementations give the same result:
  blocked      for a scalar coefficient g (GAE's gamma * lam, discounting).
               Written with integer exponents, y_t = a_t + g^n_t y_{t+1}
               (n_t = 1 at a valid step, 0 at a masked one). The time axis is
               cut into blocks of K <= 32 steps; with P_t = sum of n_s over
               the block's steps s < t and Q_t = P_t + n_t,
                 y_{t+1} = g^-Q_t (sum_{s > t in block} g^P_s a_s + g^P_end Y),
               Y being y at the start of the next block. So each block is one
               [K, K] triangular matrix product (P_t a popcount of the block's
               valid bits at the first level), and the blocks' own recurrence,
                 Y_j = (sum_{s in block j} g^P_s a_s) + g^P_end(j) Y_{j+1},
               has the same form with exponents P_end <= K: it is blocked again,
               level after level, while g^-(K * largest exponent) stays below
               1e30 (float32 range); the rest is a short lax.scan. No [B, T]
               transpose, no T-step loop, no shifted copy: the fastest on CPU.
               A coefficient too small for K = 2 at the first level, or an
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
_LARGEST_SCALE = 1e30  # g^-(exponent) above this would lose float32 range
_EXACT = jax.lax.Precision.HIGHEST


def default_method() -> str:
  """The recurrence method for the default backend.

  Returns:
    'blocked' on CPU, where it is fastest (``python -m bench.estimators``); 'associative'
    elsewhere.
  """
  return "blocked" if jax.default_backend() == "cpu" else "associative"


def _scan_next(a: Array, c: Array) -> Array:
  """y_{t+1} of y_t = a_t + c_t y_{t+1}, by a time-major lax.scan."""

  def step(y_next, x):
    a_t, c_t = x
    return a_t + c_t * y_next, y_next

  _, y_next = jax.lax.scan(step, jnp.zeros(a.shape[:1], a.dtype), (a.T, c.T), reverse=True)
  return y_next.T


def _block_size(log_g: float, largest_exponent: int) -> int | None:
  """The largest K in _BLOCKS with g^-(K * largest_exponent) <= _LARGEST_SCALE; None
  when even K = 2 is too large."""
  limit = math.log(_LARGEST_SCALE)
  return next((k for k in _BLOCKS if -k * largest_exponent * log_g <= limit), None)


def _exponents_through(n: Array, size: int, unit: bool) -> tuple[Array, Array]:
  """(Q, P_end): Q_t = sum of n_s over s <= t in its block, [B, blocks, K], and the
  block totals [B, blocks]. unit: n is 0/1, summed as popcounts of the block's bits."""
  if unit:
    steps = jnp.arange(size, dtype=jnp.uint32)
    bits = jnp.sum(jnp.where(n > 0, jnp.uint32(1) << steps, jnp.uint32(0)), axis=-1,
                   dtype=jnp.uint32)  # [B, blocks]: the block's valid steps as bits
    through = jax.lax.population_count(bits[..., None] & ((jnp.uint32(2) << steps) - 1))
    return through.astype(jnp.float32), jax.lax.population_count(bits).astype(jnp.float32)
  through = jnp.matmul(n, jnp.asarray(np.triu(np.ones((size, size))), jnp.float32),
                       precision=_EXACT)  # [s, t]: s <= t; sums of integers, exact
  return through, through[..., -1]


def _blocked_next(a: Array, log_g: float, n: Array, largest: int) -> Array:
  """y_{t+1} of y_t = a_t + g^n_t y_{t+1} (module docstring): a [B, T]; n [B, T]
  float32 holding integers in [0, largest]; log_g = log(g) <= 0."""
  size = _block_size(log_g, largest)
  if size is None:
    return _scan_next(a, jnp.exp(n * log_g))
  b, t = a.shape
  blocks = -(-t // size)
  a, n = (jnp.pad(x, [(0, 0), (0, blocks * size - t)]).reshape(b, blocks, size) for x in (a, n))
  through, total = _exponents_through(n, size, unit=largest == 1)
  weighted = jnp.exp((through - n) * log_g) * a  # g^P_t a_t
  later = jnp.matmul(weighted, jnp.asarray(np.tril(np.ones((size, size)), -1), jnp.float32),
                     precision=_EXACT)  # [s, t]: s > t
  if blocks == 1:
    start_of_next = jnp.zeros((b, 1), a.dtype)
  else:  # the blocks' recurrence, Y_{j+1} for each block j
    start_of_next = _blocked_next(jnp.sum(weighted, axis=-1), log_g, total, largest * size)
  y_next = (later + jnp.exp(total * log_g)[..., None] * start_of_next[..., None]) * jnp.exp(
      -through * log_g)
  return y_next.reshape(b, blocks * size)[:, :t]


def _compose(later, earlier):
  """(c, a) of applying `earlier` after `later`: y = a_e + c_e * (a_l + c_l * y')."""
  c_later, a_later = later
  c_earlier, a_earlier = earlier
  return c_earlier * c_later, a_earlier + c_earlier * a_later


def _associative(a: Array, c: Array) -> Array:
  _, y = jax.lax.associative_scan(_compose, (c, a), reverse=True, axis=1)
  return y


def _blocked_exponent_base(coef) -> float | None:
  """log(coef) when the blocked method applies to coef (a Python scalar in (0, 1]
  that allows blocks at the first level); None otherwise."""
  if not isinstance(coef, (int, float)) or not 0.0 < coef <= 1.0:
    return None
  log_g = math.log(coef)
  return log_g if _block_size(log_g, 1) is not None else None


def _inputs(a: Array, coef: Array | float, valid: Array, method: str | None):
  """(method, a with masked steps zeroed, c with masked steps 1, log g or None)."""
  method = method or default_method()
  _checks.check_choice(method, METHODS, "recurrence method")
  # A masked step is the identity map: a = 0, c = 1.
  a = jnp.where(valid, a, 0.0)
  log_g = _blocked_exponent_base(coef) if method == "blocked" else None
  if method == "blocked" and log_g is None:
    method = "scan"
  c = jnp.where(valid, jnp.asarray(coef, a.dtype), 1.0)
  return method, a, c, log_g


def _next(method: str, a: Array, c: Array, log_g: float | None, valid: Array) -> Array:
  if method == "blocked":
    return _blocked_next(a, log_g, valid.astype(jnp.float32), 1)
  if method == "scan":
    return _scan_next(a, c)
  return _shift_left(_associative(a, c))


def next_carry(
    a: Array, coef: Array | float, valid: Array, *, method: str | None = None
) -> Array:
  """y_{t+1} of `pass_through_recurrence`: the value position t receives from the next valid
  position (0 past the end).

  Args:
    a: ``[B, T]`` float32, finite everywhere (masked positions are ignored).
    coef: a scalar or ``[B, T]`` coefficient c_t.
    valid: ``[B, T]`` bool, the positions the recurrence runs over.
    method: one of `METHODS`, or None for `default_method()`.

  Returns:
    float32 ``[B, T]``.

  Raises:
    ValueError: on an unknown method.
  """
  return _next(*_inputs(a, coef, valid, method), valid)


def pass_through_recurrence(
    a: Array, coef: Array | float, valid: Array, *, method: str | None = None
) -> Array:
  """The backward recurrence with masked steps passing the carry through::

    y_t = a_t + c_t y_{t+1}    at valid t,
    y_t = y_{t+1}              elsewhere,     y_T = 0.

  Args:
    a: ``[B, T]`` float32, finite everywhere (masked positions are ignored).
    coef: a scalar or ``[B, T]`` coefficient c_t.
    valid: ``[B, T]`` bool, the positions the recurrence runs over.
    method: one of `METHODS`, or None for `default_method()`.

  Returns:
    float32 ``[B, T]``, y at every position (masked ones hold the carried value).

  Raises:
    ValueError: on an unknown method.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import recurrence
    >>> recurrence.pass_through_recurrence(jnp.ones((1, 3)), 0.5,
    ...                                    jnp.array([[True, False, True]]))
    Array([[1.5, 1. , 1. ]], dtype=float32)
  """
  method, a, c, log_g = _inputs(a, coef, valid, method)
  if method == "associative":
    return _associative(a, c)
  return a + c * _next(method, a, c, log_g, valid)


def _shift_left(y: Array) -> Array:
  """y_{t+1} along axis 1, with 0 past the end."""
  return jnp.pad(y[:, 1:], [(0, 0), (0, 1)])


def masked_recurrence(
    a: Array, coef: Array | float, valid: Array, *, method: str | None = None
) -> Array:
  """`pass_through_recurrence` with 0 at invalid positions: ``y_t = a_t + c_t y_next`` over
  valid positions, "next" being the next valid one.

  Args:
    a: ``[B, T]`` float32, finite everywhere (masked positions are ignored).
    coef: a scalar or ``[B, T]`` coefficient c_t.
    valid: ``[B, T]`` bool, the positions the recurrence runs over.
    method: one of `METHODS`, or None for `default_method()`.

  Returns:
    float32 ``[B, T]``, 0 where not valid.

  Raises:
    ValueError: on an unknown method.
  """
  return jnp.where(valid, pass_through_recurrence(a, coef, valid, method=method), 0.0)


def next_valid(x: Array, valid: Array, *, method: str | None = None) -> Array:
  """x at the first valid position strictly after t.

  Args:
    x: ``[B, T]`` float32.
    valid: ``[B, T]`` bool.
    method: one of `METHODS`, or None for `default_method()`.

  Returns:
    float32 ``[B, T]``; 0 where no valid position follows.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import recurrence
    >>> recurrence.next_valid(jnp.array([[1.0, 2.0, 3.0]]), jnp.array([[True, False, True]]))
    Array([[3., 3., 0.]], dtype=float32)
  """
  return next_carry(jnp.where(valid, x, 0.0), 0.0, valid, method=method)
