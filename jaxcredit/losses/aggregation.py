"""Reducing a per-token loss [B, T] to a scalar: the loss-aggregation modes."""

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, masked_mean, sanitise

AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def aggregate(loss_tok: Array, mask: Array, mode: str, *, norm_len: int | None = None) -> Array:
  """Aggregates a per-token loss over valid tokens.

  With l = loss_tok, m = mask, B rows and T columns::

    token-mean              sum(l*m) / sum(m)                 (DAPO, verl default)
    seq-mean-token-sum      mean_b sum_t l*m
    seq-mean-token-mean     mean_b (sum_t l*m / sum_t m)      (original GRPO)
    seq-mean-token-sum-norm sum(l*m) / (B * L), L = norm_len or T  (Dr. GRPO)

  Rows with no valid token contribute 0; nothing divides by 0. Masked values
  (even NaN) never reach the result or its gradient.

  Args:
    loss_tok: ``[B, T]`` per-token losses.
    mask: ``[B, T]`` the tokens that count.
    mode: one of `AGGREGATIONS` (above).
    norm_len: L of "seq-mean-token-sum-norm" (None: T).

  Returns:
    A float32 scalar.

  Raises:
    ValueError: for an unknown mode or mismatched shapes.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import losses
    >>> loss_tok = jnp.array([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    >>> mask = jnp.array([[True, True, True], [True, False, False]])
    >>> float(losses.aggregate(loss_tok, mask, "token-mean"))  # (1 + 1 + 1 + 4) / 4
    1.75
    >>> float(losses.aggregate(loss_tok, mask, "seq-mean-token-mean"))  # (1 + 4) / 2
    2.5
  """
  _checks.check_rank(loss_tok, 2, "loss_tok")
  _checks.check_same_shape(loss_tok=loss_tok, mask=mask)
  _checks.check_choice(mode, AGGREGATIONS, "aggregation mode")
  valid = as_bool(mask)
  loss_tok = sanitise(loss_tok, valid)
  if mode == "token-mean":
    return masked_mean(loss_tok, valid)
  if mode == "seq-mean-token-sum":
    return jnp.mean(jnp.sum(loss_tok, axis=1))
  if mode == "seq-mean-token-mean":
    return jnp.mean(masked_mean(loss_tok, valid, axis=1))
  if norm_len is not None and (not isinstance(norm_len, int) or norm_len < 1):
    raise ValueError(f"norm_len must be a positive int or None, got {norm_len!r}.")
  length = norm_len or loss_tok.shape[1]
  return jnp.sum(loss_tok) / (loss_tok.shape[0] * length)
