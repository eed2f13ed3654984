"""Mask helpers: a mask marks policy actions; everything else is inert.

Values at masked positions must never influence a result or a gradient, even
when they are NaN or Inf. `jnp.where` *before* any arithmetic is the only safe
sanitiser: `x * mask` gives NaN for NaN * 0, and a `where` after an `exp`
still sends NaN into the backward pass.
"""

import jax
import jax.numpy as jnp
from jax import Array


def as_bool(mask: Array) -> Array:
  """A bool or 0/1 numeric mask as bool; ValueError for any other dtype."""
  dtype = getattr(mask, "dtype", None)
  if dtype is None or not (dtype == jnp.bool_ or jnp.issubdtype(dtype, jnp.number)):
    raise ValueError(
        f"mask must be a bool or 0/1 numeric array, got {type(mask).__name__} of dtype {dtype}.")
  return mask if dtype == jnp.bool_ else mask != 0


def sanitise(x: Array, valid: Array, fill: float = 0.0) -> Array:
  """`x` as float32 with `fill` at invalid positions (safe for NaN/Inf there)."""
  return jnp.where(valid, x.astype(jnp.float32), fill)


def masked_sum(x: Array, valid: Array, axis=None) -> Array:
  """Sum of `x` over valid positions; `x` must already be sanitised or finite."""
  return jnp.sum(jnp.where(valid, x, 0.0), axis=axis)


def safe_divide(num: Array, den: Array) -> Array:
  """num / den, and 0 where den == 0 (both branches NaN-free for grads)."""
  nonzero = den != 0
  return jnp.where(nonzero, num / jnp.where(nonzero, den, 1.0), 0.0)


def safe_sqrt(x: Array) -> Array:
  """sqrt with a finite gradient at 0 (the gradient there is taken as 0)."""
  positive = x > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def scale_down(x: Array, axis=None) -> tuple[Array, Array]:
  """(x / scale, scale) with scale = max(1, max |x|) over `axis` (keepdims).

  Working on x / scale keeps huge finite values (|x| ~ 1e19 squares past
  float32's max) from overflowing in centring and squares; for |x| <= 1 it is
  a no-op (bitwise). Values beyond 2^62 are first multiplied by 2^-64 (exact),
  because XLA divides by multiplying with the reciprocal, and 1 / 1e38 is a
  subnormal that the CPU flushes to 0. The scale is a constant for autodiff:
  callers' results do not depend on it, and its own gradient could overflow.
  """
  magnitude = jax.lax.stop_gradient(jnp.max(jnp.abs(x), axis=axis, keepdims=True))
  coarse = jnp.where(magnitude > 2.0**62, 2.0**-64, 1.0)
  fine = jnp.maximum(magnitude * coarse, 1.0)
  return (x * coarse) / fine, fine / coarse


def masked_mean(x: Array, valid: Array, axis=None) -> Array:
  """Mean of `x` over valid positions; 0 where none are valid."""
  return safe_divide(
      masked_sum(x, valid, axis), jnp.sum(valid, axis=axis, dtype=jnp.float32)
  )


def top_n_mask(scores: Array, eligible: Array, n: Array | int) -> Array:
  """The `n` eligible entries with the highest scores (ties: first position wins).

  scores, eligible: same shape; n may be traced. Returns a bool mask of that shape.
  """
  flat = jnp.where(eligible, scores.astype(jnp.float32), -jnp.inf).reshape(-1)
  order = jnp.argsort(-flat, stable=True)
  ranks = jnp.zeros_like(order).at[order].set(jnp.arange(order.size, dtype=order.dtype))
  return (ranks.reshape(scores.shape) < n) & eligible
