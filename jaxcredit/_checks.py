"""Trace-time input validation shared by the pure layers.

Every check raises `ValueError` naming the argument and the offending shape or
value, so a bad call fails at trace time with a message the user can act on.
"""

import math
from collections.abc import Iterable

import jax
import jax.numpy as jnp
from jax import Array


def check_rank(x: Array, rank: int | Iterable[int], name: str) -> None:
  """Raises if `x.ndim` is not `rank` (or not one of `rank`)."""
  ranks = (rank,) if isinstance(rank, int) else tuple(rank)
  if jnp.ndim(x) not in ranks:
    raise ValueError(
        f"{name} must have rank {' or '.join(map(str, ranks))}, "
        f"got shape {jnp.shape(x)}."
    )


def check_shape(x: Array, shape: tuple[int, ...], name: str) -> None:
  """Raises unless `x` has exactly `shape`."""
  if tuple(jnp.shape(x)) != tuple(shape):
    raise ValueError(f"{name} must have shape {list(shape)}, got {list(jnp.shape(x))}.")


def check_same_shape(**arrays: Array | None) -> None:
  """Raises unless all non-None arrays share one shape."""
  shapes = {k: jnp.shape(v) for k, v in arrays.items() if v is not None}
  if len(set(shapes.values())) > 1:
    described = ", ".join(f"{k}{list(s)}" for k, s in shapes.items())
    raise ValueError(f"Shapes must match: {described}.")


def check_group_size(batch: int, group_size: int) -> None:
  """Raises unless `group_size` is a positive divisor of `batch`."""
  if not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f"group_size must be a positive int, got {group_size!r}.")
  if batch % group_size:
    raise ValueError(
        f"Batch size {batch} is not divisible by group_size {group_size}: "
        "rows of a group must be contiguous and complete."
    )


def check_token_and_seq(
    token_arrays: dict[str, Array | None],
    seq_arrays: dict[str, Array | None],
) -> None:
  """Raises unless token arrays are [B, T] of one shape and seq arrays are [B]."""
  for name, x in token_arrays.items():
    if x is not None:
      check_rank(x, 2, name)
  check_same_shape(**token_arrays)
  batch = next(jnp.shape(x)[0] for x in token_arrays.values() if x is not None)
  for name, x in seq_arrays.items():
    if x is not None:
      check_rank(x, 1, name)
      if jnp.shape(x)[0] != batch:
        raise ValueError(
            f"{name} must have shape [B]=[{batch}] to match the token arrays, "
            f"got {jnp.shape(x)}."
        )


def check_choice(value: str, choices: Iterable[str], name: str) -> None:
  """Raises unless `value` is one of `choices`, listing them."""
  choices = tuple(choices)
  if value not in choices:
    raise ValueError(f"Unknown {name} {value!r}; known: {', '.join(choices)}.")


def check_in_range(
    value, name: str, *, low: float | None = None, high: float | None = None, low_open: bool = False
) -> None:
  """Raises unless the hyperparameter `value` is a number in [low, high]
  (low excluded with `low_open`); NaN is always rejected. Traced values are
  not checked (they are unknown at trace time)."""
  if isinstance(value, jax.core.Tracer):
    return
  if isinstance(value, (str, bytes)) or jnp.ndim(value) != 0:
    raise ValueError(f"{name} must be a number, got {value!r}.")
  number = float(value)
  below = low is not None and (number <= low if low_open else number < low)
  above = high is not None and number > high
  if math.isnan(number) or below or above:
    if high is None:
      bounds = f"{'>' if low_open else '>='} {low:g}"
    else:
      lower = "-inf" if low is None else format(low, "g")
      bounds = f"in {'(' if low_open else '['}{lower}, {high:g}]"
    raise ValueError(f"{name} must be {bounds}, got {value!r}.")


def require(conditions: Iterable[tuple[bool, str]]) -> None:
  """Raises ValueError(message + ".") for the first (ok, message) that is not ok."""
  for ok, message in conditions:
    if not ok:
      raise ValueError(message + ".")
