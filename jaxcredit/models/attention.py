"""Causal grouped-query attention over slots, naive or blockwise.

Shapes: q [B, T, KV, G, hd] (G query heads per KV head), keys / values
[B, S, KV, hd]; query_slots [T] int (the slot of each query in the key
sequence); key_valid [B, S] bool. Query t attends to the keys in slots
s <= query_slots[t] with key_valid[b, s]; a query that sees no key (a padding
row) gets the mean of every value, in both implementations. Output
[B, T, KV, G, hd] in the values' dtype.

  xla      the whole [B, KV, G, T, S] float32 score matrix at once.
  chunked  blockwise with an online softmax (Rabe & Staats, 2021; the flash
           attention recurrence): query blocks of `block_size` in a `lax.scan`,
           each under `jax.checkpoint`, scanning key blocks of `block_size`
           with a running max m, normaliser l and accumulator a:
             m' = max(m, max_s z_s),  l' = l e^(m - m') + sum_s e^(z_s - m'),
             a' = a e^(m - m') + sum_s e^(z_s - m') v_s,  out = a / l.
           Forward and backward hold one query block's scores against the
           keys ([B, KV, G, block, S]) at a time: memory linear in T. When T
           and S fit in one block this is the xla computation, and runs as it.
"""

import functools

import jax
import jax.numpy as jnp
from jax import Array

IMPLEMENTATIONS = ("chunked", "xla")
_MASKED = jnp.finfo(jnp.float32).min  # a masked key: still counted by a row that sees no key
_PADDING = -jnp.inf  # a slot added to fill the last block: never counted


def attention(q: Array, keys: Array, values: Array, query_slots: Array, key_valid: Array, *,
              implementation: str = "xla", block_size: int = 512) -> Array:
  """Causal attention (module docstring); scores in float32, scaled by 1 / sqrt(hd)."""
  single_block = max(q.shape[1], keys.shape[1]) <= block_size
  if implementation == "xla" or (implementation == "chunked" and single_block):
    return _naive(q, keys, values, query_slots, key_valid)  # one block: the same computation
  if implementation == "chunked":
    return _blockwise(q, keys, values, query_slots, key_valid, block_size)
  raise ValueError(f"Unknown attention implementation {implementation!r}; known: "
                   f"{', '.join(IMPLEMENTATIONS)}.")


def _scores(q, keys, query_slots, key_slots, key_valid):
  """[B, KV, G, T, S] float32 masked scores."""
  scores = jnp.einsum("btkgd,bskd->bkgts", q, keys, preferred_element_type=jnp.float32)
  visible = (key_slots[None, :] <= query_slots[:, None])[None] & key_valid[:, None, :]
  return jnp.where(visible[:, None, None], scores / jnp.sqrt(q.shape[-1]), _MASKED)


def _naive(q, keys, values, query_slots, key_valid):
  scores = _scores(q, keys, query_slots, jnp.arange(keys.shape[1]), key_valid)
  probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
  return jnp.einsum("bkgts,bskd->btkgd", probs, values)


def _padded(x: Array, size: int, axis: int, fill) -> Array:
  """x padded along `axis` to a multiple of `size` with `fill` (no copy when it already is)."""
  extra = -x.shape[axis] % size
  if not extra:
    return x
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, extra)
  return jnp.pad(x, pad, constant_values=fill)


def _block(x: Array, index, size: int, axis: int) -> Array:
  return jax.lax.dynamic_slice_in_dim(x, index * size, size, axis=axis)


def _blockwise(q, keys, values, query_slots, key_valid, block_size: int):
  """Blocks are read in place with dynamic slices (a decode step reads the cache
  block by block); only a length that is not a multiple of the block is padded."""
  b, t, n_kv, group, hd = q.shape
  s = keys.shape[1]
  q_size, k_size = min(block_size, t), min(block_size, s)
  keys, values = _padded(keys, k_size, 1, 0), _padded(values, k_size, 1, 0)
  key_valid = _padded(key_valid, k_size, 1, False)
  key_slots = jnp.arange(keys.shape[1])
  real = key_slots < s

  @functools.partial(jax.checkpoint, prevent_cse=False)
  def query_block(q_block, q_slots):
    def key_block(carry, j):
      m, l, acc = carry
      v_block = _block(values, j, k_size, 1)
      k_block, valid_block = _block(keys, j, k_size, 1), _block(key_valid, j, k_size, 1)
      scores = _scores(q_block, k_block, q_slots, _block(key_slots, j, k_size, 0), valid_block)
      scores = jnp.where(_block(real, j, k_size, 0), scores, _PADDING)
      m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
      p = jnp.exp(scores - m_new[..., None])
      correction = jnp.exp(m - m_new)
      l = l * correction + jnp.sum(p, axis=-1)
      acc = acc * correction[..., None] + jnp.einsum(
          "bkgts,bskd->bkgtd", p.astype(v_block.dtype), v_block,
          preferred_element_type=jnp.float32)
      return (m_new, l, acc), None

    rows = (b, n_kv, group, q_block.shape[1])
    init = (jnp.full(rows, _MASKED), jnp.zeros(rows), jnp.zeros((*rows, hd)))
    (_, l, acc), _ = jax.lax.scan(key_block, init, jnp.arange(keys.shape[1] // k_size))
    return jnp.einsum("bkgtd->btkgd", acc / l[..., None]).astype(values.dtype)

  q, query_slots = _padded(q, q_size, 1, 0), _padded(query_slots, q_size, 0, 0)

  def step(_, i):
    return None, query_block(_block(q, i, q_size, 1), _block(query_slots, i, q_size, 0))

  _, out = jax.lax.scan(step, None, jnp.arange(q.shape[1] // q_size))
  return jnp.moveaxis(out, 0, 1).reshape(b, -1, n_kv, group, hd)[:, :t]
