"""Per-token log-probabilities, entropies and importance ratios from a policy's logits.

Shapes: logits `[..., V]` with tokens `[...]` (typically `[B, T, V]` and `[B, T]`). All
reductions run in float32 whatever the input dtype.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array


def _check_logits_tokens(logits: Array, tokens: Array) -> None:
  if jnp.shape(logits)[:-1] != jnp.shape(tokens):
    raise ValueError(
        f"logits{list(jnp.shape(logits))} must be tokens{list(jnp.shape(tokens))}"
        " plus a trailing vocabulary axis."
    )


def _check_token_ids(tokens: Array, vocab_size: int) -> None:
  """Raises ValueError when concrete `tokens` hold ids outside [0, vocab_size).

  Traced tokens cannot be checked here; `_picked_logprob` makes their result NaN.
  """
  if isinstance(tokens, jax.core.Tracer):
    return
  tokens = np.asarray(tokens)
  bad = (tokens < 0) | (tokens >= vocab_size)
  if bad.any():
    where = tuple(int(i[0]) for i in np.nonzero(bad))
    raise ValueError(
        f"tokens hold {int(bad.sum())} id(s) outside [0, {vocab_size}) (first: "
        f"{int(tokens[where])} at index {list(where)}); replace ignore labels such as -100 with "
        "a valid id and mask those positions.")


def _in_vocab(tokens: Array, vocab_size: int) -> Array:
  return (tokens >= 0) & (tokens < vocab_size)


def _picked_logprob(logits: Array, tokens: Array, lse: Array) -> Array:
  """logits[..., token] - lse; NaN (with no gradient) where the token id is
  outside [0, V), never the log-prob of a wrapped or clamped id."""
  in_vocab = _in_vocab(tokens, logits.shape[-1])
  picked = jnp.take_along_axis(logits, jnp.where(in_vocab, tokens, 0)[..., None], axis=-1)[..., 0]
  return jnp.where(in_vocab, picked - lse, jnp.nan)


def token_logprobs(logits: Array, tokens: Array, *, temperature: float = 1.0) -> Array:
  """Per-token log-probs: ``log pi(token) = log_softmax(logits / temperature)[token]``.

  Use the sampling temperature, so that ratios against the sampler's behaviour log-probs
  are consistent.

  Args:
    logits: ``[..., V]``, any float dtype (upcast to float32).
    tokens: ``[...]`` int token ids.
    temperature: the softmax temperature.

  Returns:
    float32 ``[...]``. Under jit an id outside ``[0, V)`` gives NaN (and no gradient), never
    the log-prob of another token.

  Raises:
    ValueError: on mismatched shapes, or an id outside ``[0, V)`` when `tokens` is concrete.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import logprobs
    >>> logits = jnp.log(jnp.array([[0.25, 0.75]]))
    >>> logprobs.token_logprobs(logits, jnp.array([1])).round(4)  # log 0.75
    Array([-0.2877], dtype=float32)
  """
  _check_logits_tokens(logits, tokens)
  _check_token_ids(tokens, logits.shape[-1])
  logits = logits.astype(jnp.float32) / temperature
  return _picked_logprob(logits, tokens, jax.nn.logsumexp(logits, axis=-1))


def token_entropy(logits: Array) -> Array:
  """Entropy of the softmax: ``H = logsumexp(z) - sum_v p_v z_v``.

  Args:
    logits: ``[..., V]``; -inf logits (banned tokens) are allowed and contribute 0.

  Returns:
    float32 ``[...]``, in nats.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import logprobs
    >>> logprobs.token_entropy(jnp.array([[0.0, 0.0], [0.0, -jnp.inf]])).round(4)  # log 2, 0
    Array([0.6931, 0.    ], dtype=float32)
  """
  logits = logits.astype(jnp.float32)
  probs = jax.nn.softmax(logits, axis=-1)
  finite_logits = jnp.where(jnp.isfinite(logits), logits, 0.0)
  return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(probs * finite_logits, axis=-1)

LOG_RATIO_BOUND = 20.0
"""|log-ratio| above which `importance_ratio` saturates (as verl's policy losses)."""


def importance_ratio(log_ratio: Array, *, bound: float = LOG_RATIO_BOUND) -> Array:
  """``exp(clip(log_ratio, -bound, bound))``: a ratio that cannot overflow.

  exp overflows float32 at log-ratio ~88.7 (a stale behaviour policy in off-policy or
  asynchronous training reaches that), and an inf ratio gives a NaN gradient even where a
  clip or `where` discards it. Beyond +-bound the ratio is constant (gradient 0): e^20 ~
  4.9e8 is far outside any trust region.

  Args:
    log_ratio: any shape, log pi - log mu.
    bound: the clip of the log-ratio, > 0.

  Returns:
    float32, the shape of `log_ratio`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import logprobs
    >>> logprobs.importance_ratio(jnp.array([0.0, 1000.0]), bound=2.0)
    Array([1.      , 7.389056], dtype=float32)
  """
  return jnp.exp(jnp.clip(log_ratio.astype(jnp.float32), -bound, bound))


def token_sum_probs_squared(logits: Array) -> Array:
  """The collision probability of the policy at each position::

    sum_v softmax(z)_v^2 = exp(logsumexp(2 z) - 2 logsumexp(z))

  With the sampled token's probability p it gives ``||e_a - pi||^2 = 1 - 2 p + sum pi^2``,
  the logit-gradient proxy of the optimal token baseline.

  Args:
    logits: ``[..., V]``.

  Returns:
    float32 ``[...]``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import logprobs
    >>> logprobs.token_sum_probs_squared(jnp.zeros((4,)))
    Array(0.25, dtype=float32)
  """
  logits = logits.astype(jnp.float32)
  return jnp.exp(jax.nn.logsumexp(2.0 * logits, axis=-1) - 2.0 * jax.nn.logsumexp(logits, axis=-1))
