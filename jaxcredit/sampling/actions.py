"""Typed action sets and hidden inputs: what the policy may emit and what it sees.

One `Actions` describes the columns of [B, L] rows (a prompt, then response
slots). The sampler, the learner and the oracle apply the same two transforms,
so behaviour log-probs, teacher-forced log-probs and exact credit agree:

  restricted logits  mask_logits(logits, allowed)       -inf outside allowed[t]
  the model's input  observed_inputs(tokens, hidden, h)  h where hidden[t]

Tasks without typed actions use `Actions()` (every token allowed, every token
seen).
"""

from typing import NamedTuple

import jax.numpy as jnp
from jax import Array


def mask_logits(logits: Array, allowed: Array | None) -> Array:
  """Logits restricted to the allowed tokens.

  Args:
    logits: ``[..., V]``.
    allowed: bool, broadcast over the leading axes of `logits` (``[V]``, ``[L, V]``, ...),
      or None (every token).

  Returns:
    `logits` where allowed, -inf elsewhere.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.sampling import actions
    >>> actions.mask_logits(jnp.zeros(3), jnp.array([True, False, True]))
    Array([  0., -inf,   0.], dtype=float32)
  """
  return logits if allowed is None else jnp.where(allowed, logits, -jnp.inf)


def observed_inputs(tokens: Array, hidden: Array | None, hidden_token: int) -> Array:
  """The model's input view of rows: `hidden_token` where a column is hidden.

  Args:
    tokens: ``[B, L]`` int.
    hidden: ``[L]`` or ``[B, L]`` bool, or None (nothing hidden).
    hidden_token: the id fed in place of a hidden token.

  Returns:
    int ``[B, L]``.
  """
  return tokens if hidden is None else jnp.where(hidden, hidden_token, tokens)


class Actions(NamedTuple):
  """Per-column action constraints of [B, L] rows (a pytree).

  Prompt columns are allowed and visible by convention.

  Attributes:
    allowed: ``[L, V]`` or per row ``[B, L, V]`` bool, ``[V]`` (the same set at every
      column, e.g. a tokenizer's ids within a padded embedding), or None (every token): the
      policy at column t is the softmax renormalised over allowed[t] (the other logits are
      -inf).
    hidden: ``[L]`` or per row ``[B, L]`` bool, or None: columns whose token is the action
      taken (recorded, scored, credited) but is fed to the model as `hidden_token`
      (filler-blind tasks).
    hidden_token: int, the id the model sees at hidden columns.
  """

  allowed: Array | None = None
  hidden: Array | None = None
  hidden_token: int = 0

  @property
  def per_column(self) -> bool:
    """Whether `allowed` is a table of columns ([L, V] or [B, L, V]), not one [V] set or None."""
    return self.allowed is not None and self.allowed.ndim > 1

  def columns(self, start: int, stop: int | None = None) -> "Actions":
    """The constraints of columns start..stop-1 (per-row tables keep their rows)."""
    cut = slice(start, stop)
    return self._replace(allowed=self.allowed[..., cut, :] if self.per_column else self.allowed,
                         hidden=None if self.hidden is None else self.hidden[..., cut])

  def observe(self, tokens: Array) -> Array:
    """The model's input view of [B, L] tokens (`observed_inputs`)."""
    return observed_inputs(tokens, self.hidden, self.hidden_token)
