"""Drawing one token per row: `sample_token` (temperature, top-k, top-p) by `inverse_cdf_sample`,
two uniforms per row rather than a Gumbel variate per logit."""

import jax
import jax.numpy as jnp
from jax import Array


def sample_token(logits: Array, key: Array, *, temperature: float, top_k: int | None,
                 top_p: float | None) -> Array:
  """Samples one token per row; temperature 0 is greedy.

  Draws from ``softmax(logits / temperature)``, truncated to the top_k tokens and then to
  the smallest set of top tokens whose mass reaches top_p, by `inverse_cdf_sample`: two
  uniforms per row rather than a Gumbel variate per logit (`jax.random.categorical`), whose
  random bits and two logarithms per logit cost more than the rest of a CPU decode step
  (``python -m bench.sampler`` times both draws).

  Args:
    logits: ``[B, V]``.
    key: a PRNG key, or ``[B]`` keys, one per row (a row's draw then depends on its key and
      logits only, not on the rest of the batch).
    temperature: >= 0.
    top_k: keep the k most likely tokens, or None.
    top_p: keep the smallest set of top tokens whose mass reaches p, or None.

  Returns:
    int32 ``[B]``.
  """
  if temperature == 0.0:
    return jnp.argmax(logits, axis=-1)
  logits = logits.astype(jnp.float32) / temperature
  if top_k is not None:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p is not None:
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
    # Keep the smallest prefix whose mass reaches top_p (always the top token).
    cutoff_index = jnp.sum(cumulative < top_p, axis=-1, keepdims=True)
    cutoff = jnp.take_along_axis(sorted_logits, cutoff_index, axis=-1)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  if jnp.ndim(key) == 1:  # a key per row: each row's draw depends on its own key alone
    uniforms = jax.vmap(lambda k: jax.random.uniform(k, (2,)))(key).T
  else:
    uniforms = jax.random.uniform(key, (2, logits.shape[0]))
  return inverse_cdf_sample(jax.nn.softmax(logits, axis=-1), uniforms[0], uniforms[1])


def step_key(key: Array, step) -> Array:
  """`key` folded with `step`: one key, or each of a ``[B]`` batch of per-row keys.

  Args:
    key: a PRNG key, or ``[B]`` keys.
    step: an int (traced or not), or with ``[B]`` keys a ``[B]`` array, a step per row.

  Returns:
    the folded key(s), of `key`'s shape.
  """
  if jnp.ndim(key) == 1:
    return jax.vmap(jax.random.fold_in, (0, 0 if jnp.ndim(step) == 1 else None))(key, step)
  return jax.random.fold_in(key, step)


def _first_above(cumulative: Array, threshold: Array, positive: Array) -> Array:
  """Per row, the first index i with cumulative[i] > threshold, clamped to the
  last index where `positive` holds (float rounding can leave the threshold
  at or above the total)."""
  count = jnp.sum(cumulative <= threshold[:, None], axis=-1)
  last = positive.shape[-1] - 1 - jnp.argmax(positive[:, ::-1], axis=-1)
  return jnp.minimum(count, last)


def inverse_cdf_sample(probs: Array, block_uniform: Array, token_uniform: Array, *,
                       block: int = 128) -> Array:
  """Samples one index per row of non-negative weights from two uniforms per row.

  The vocabulary is cut into blocks of `block` entries with masses S_j: the block is j with
  ``C_(j-1) <= u_1 C_last < C_j`` (C the cumulative block masses), then the index within it
  is i with ``c_(i-1) <= u_2 c_last < c_i`` (c the block's own cumulative sums).
  ``P(j, i) = S_j / C_last * p_ji / S_j = p_ji / total``, exactly in law; the second uniform
  resolves each block's entries relative to the block, not to the whole vocabulary.

  Args:
    probs: ``[B, V]`` non-negative, any positive total per row.
    block_uniform: ``[B]`` uniforms in [0, 1), choosing the block.
    token_uniform: ``[B]`` uniforms in [0, 1), choosing the index within it.
    block: entries per block.

  Returns:
    int32 ``[B]``; an entry with probability 0 is never returned.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.sampling import draw
    >>> draw.inverse_cdf_sample(jnp.array([[0.0, 1.0, 3.0]]), jnp.array([0.5]),
    ...                         jnp.array([0.0]), block=2)
    Array([2], dtype=int32)
  """
  batch, vocab = probs.shape
  blocks = -(-vocab // block)
  probs = jnp.pad(probs, [(0, 0), (0, blocks * block - vocab)]).reshape(batch, blocks, block)
  mass = jnp.sum(probs, axis=-1)  # [B, blocks]
  cumulative = jnp.cumsum(mass, axis=-1)
  j = _first_above(cumulative, block_uniform * cumulative[:, -1], mass > 0)
  within = jnp.take_along_axis(probs, j[:, None, None], axis=1)[:, 0]  # [B, block]
  cumulative = jnp.cumsum(within, axis=-1)
  i = _first_above(cumulative, token_uniform * cumulative[:, -1], within > 0)
  return (j * block + i).astype(jnp.int32)
