"""Causal grouped-query attention over slots, naive or blockwise.

Shapes: q [B, T, KV, G, hd] (G query heads per KV head), keys / values
[B, KV, S, hd] (heads before slots: each head's keys are a contiguous [S, hd] matrix, which
a batched matmul reads in place); query_slots [T] int (the slot of each query in the key
sequence); key_valid [B, S] bool. Query t attends to the keys in slots
s <= query_slots[t] with key_valid[b, s]; a query that sees no key (a padding
row) gets the mean of every value, in both implementations. Output
[B, T, KV, G, hd] in the values' dtype.

  xla      the whole [B, KV, G, T, S] float32 score matrix at once.
  cudnn    cuDNN's fused flash attention through `jax.nn.dot_product_attention`
           (CUDA GPUs only; elsewhere a ValueError), the slot mask passed as a
           [B, 1, T, S] bool.
  splash   the Pallas splash attention kernel (TPUs only; elsewhere a
           ValueError) for teacher-forced passes: causal mask, padding as
           segment ids. A decode step against a cache runs the blockwise kernel.
  chunked  blockwise with an online softmax (Rabe & Staats, 2021; the flash
           attention recurrence): query blocks of `block_size` in a `lax.scan`,
           each scanning key blocks of `block_size` with a running max m,
           normaliser l and accumulator a:
             m' = max(m, max_s z_s),  l' = l e^(m - m') + sum_s e^(z_s - m'),
             a' = a e^(m - m') + sum_s e^(z_s - m') v_s,  out = a / l.
           A custom VJP keeps only the output and each row's m and l, and the
           backward pass recomputes the scores block by block (flash
           attention's backward, `_flash_backward`): forward and backward hold
           one [B, KV, G, block, block] block of scores at a time, so memory is
           linear in T and S. A query block scans only the key blocks up to its
           last slot (causal): a teacher-forced pass computes the lower
           triangle of blocks, and a decode step against a cache reads the
           written slots, not the whole cache. When T and S fit in one block
           this is the xla computation, and runs as it.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

IMPLEMENTATIONS = ("chunked", "xla", "cudnn", "splash")
_MASKED = jnp.finfo(jnp.float32).min  # a masked key: the running max of a row that sees no key
_PADDING = -jnp.inf  # a slot added to fill the last block: never counted


def attention(q: Array, keys: Array, values: Array, query_slots: Array, key_valid: Array, *,
              implementation: str = "xla", block_size: int = 512, layer=None) -> Array:
  """Causal grouped-query attention (module docstring); scores in float32, scaled by
  1 / sqrt(hd).

  Args:
    q: ``[B, T, KV, G, hd]`` queries, G query heads per KV head.
    keys: ``[B, KV, S, hd]``.
    values: ``[B, KV, S, hd]``.
    query_slots: ``[T]`` int, the slot of each query in the key sequence.
    key_valid: ``[B, S]`` bool.
    implementation: one of `IMPLEMENTATIONS`.
    block_size: the query and key block of "chunked" and "splash".
    layer: None, or an int index: keys and values are then a stacked cache
      ``[n_layers, B, KV, S, hd]`` and this layer's are attended. "chunked" reads its key
      blocks from the stacked cache in place (a decode step copies no layer of it; forward
      only), the others take the layer's slice.

  Returns:
    ``[B, T, KV, G, hd]`` in the values' dtype; a query that sees no key gets zeros.

  Raises:
    ValueError: on an unknown implementation, or "cudnn" / "splash" off a GPU / TPU.

  References:
    Rabe and Staats, 2021, "Self-attention Does Not Need O(n^2) Memory", arXiv 2112.05682;
    Dao et al., 2022, "FlashAttention", arXiv 2205.14135.
  """
  single_block = max(q.shape[1], keys.shape[-2]) <= block_size
  if layer is not None and (implementation != "chunked" or single_block
                            or keys.shape[-2] % block_size):
    keys, values, layer = keys[layer], values[layer], None  # a padded cache would be copied
  if implementation == "xla" or (implementation == "chunked" and single_block):
    return _naive(q, keys, values, query_slots, key_valid)  # one block: the same computation
  if implementation == "chunked":
    return _blockwise(q, keys, values, query_slots, key_valid, block_size, layer)
  if implementation == "cudnn":
    if jax.default_backend() != "gpu":
      raise ValueError(f"model.attention='cudnn' (cuDNN flash attention) needs a CUDA GPU; "
                       f"this backend is {jax.default_backend()}: use 'chunked' (any backend) "
                       "or 'xla'.")
    return _fused(q, keys, values, query_slots, key_valid, "cudnn")
  if implementation == "splash":
    if jax.default_backend() != "tpu":
      raise ValueError(f"model.attention='splash' (the Pallas splash attention kernel) needs a "
                       f"TPU; this backend is {jax.default_backend()}: use 'chunked' (any "
                       "backend), 'cudnn' on GPUs, or 'xla'.")
    return _splash(q, keys, values, key_valid, block_size)
  raise ValueError(f"Unknown attention implementation {implementation!r}; known: "
                   f"{', '.join(IMPLEMENTATIONS)}.")


def _visible(query_slots, key_slots, key_valid):
  """[B, 1, 1, T, S] bool: key s is a valid slot at or before query t's."""
  visible = (key_slots[None, :] <= query_slots[:, None])[None] & key_valid[:, None, :]
  return visible[:, None, None]


def _scores(q, keys, visible):
  """[B, KV, G, T, S] float32 scores / sqrt(hd), _MASKED where not visible."""
  scores = jnp.einsum("btkgd,bksd->bkgts", q, keys, preferred_element_type=jnp.float32)
  return jnp.where(visible, scores / jnp.sqrt(q.shape[-1]), _MASKED)


def _naive(q, keys, values, query_slots, key_valid):
  visible = _visible(query_slots, jnp.arange(keys.shape[2]), key_valid)
  probs = jax.nn.softmax(_scores(q, keys, visible), axis=-1)
  probs = jnp.where(visible.any(-1, keepdims=True), probs, 0.0).astype(values.dtype)
  # The product in the batched matmul's own order, then the (query-sized) output transposed.
  return jnp.einsum("bkgtd->btkgd", jnp.einsum("bkgts,bksd->bkgtd", probs, values))


def _fused(q, keys, values, query_slots, key_valid, implementation: str):
  """`jax.nn.dot_product_attention` (cuDNN flash attention on GPU) with the slot
  mask as a [B, 1, T, S] bool (the kernel reads it as a bias): the query heads
  of each KV head are consecutive, as `jax.nn` expects for grouped queries."""
  b, t, n_kv, group, hd = q.shape
  visible = _visible(query_slots, jnp.arange(keys.shape[2]), key_valid)[:, 0]
  slots_first = lambda x: jnp.swapaxes(x, 1, 2)  # [B, S, KV, hd], as jax.nn takes them
  out = jax.nn.dot_product_attention(q.reshape(b, t, n_kv * group, hd), slots_first(keys),
                                     slots_first(values), mask=visible,
                                     implementation=implementation)
  seen = jnp.moveaxis(visible.any(-1), 1, 2)[..., None, None]  # [B, T, 1, 1, 1]
  return jnp.where(seen, out.reshape(q.shape), 0).astype(values.dtype)


def _splash(q, keys, values, token_valid, block_size: int, interpret: bool = False):
  """Self-attention (T = S, query t in slot t) through the Pallas splash kernel
  (`jax.experimental.pallas.ops.tpu.splash_attention`; interpret=True runs it
  on any backend): a causal mask and segment ids token_valid (1) / padding (0),
  so a real query sees the real keys at or before it, as in the other
  implementations; a padding query sees the padding before it (its output is
  never read by a real token). T is padded to a multiple of the block."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash
  b, t, n_kv, group, hd = q.shape
  if keys.shape[2] != t:
    raise ValueError(f"attention='splash' runs teacher-forced passes (T = S); got T = {t} "
                     f"queries against S = {keys.shape[2]} keys.")
  size = min(block_size, -(-t // 128) * 128)
  length = -(-t // size) * size
  mask = splash.MultiHeadMask([splash.CausalMask((length, length))] * (n_kv * group))
  blocks = splash.BlockSizes(block_q=size, block_kv=size, block_kv_compute=size,
                             block_q_dkv=size, block_kv_dkv=size, block_kv_dkv_compute=size,
                             block_q_dq=size, block_kv_dq=size)
  kernel = splash.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1,
                                  interpret=interpret)
  scaled = (q.astype(jnp.float32) / jnp.sqrt(hd)).astype(q.dtype).reshape(b, t, -1, hd)
  scaled = jnp.moveaxis(_padded(scaled, size, 1, 0), 2, 1)  # [B, H, T, hd], as keys are
  keys, values = _padded(keys, size, 2, 0), _padded(values, size, 2, 0)
  segments = _padded(token_valid, size, 1, False).astype(jnp.int32)
  out = jax.vmap(lambda q, k, v, ids: kernel(q, k, v, segment_ids=splash.SegmentIds(ids, ids)))(
      scaled, keys, values, segments)
  return jnp.moveaxis(out, 1, 2)[:, :t].reshape(q.shape).astype(values.dtype)


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


def _blockwise(q, keys, values, query_slots, key_valid, block_size: int, layer=None):
  """Blocks are read in place with dynamic slices (a decode step reads the cache
  block by block, from the stacked cache when `layer` is given: forward only); only
  a length that is not a multiple of the block is padded."""
  t, s = q.shape[1], keys.shape[-2]
  sizes = (min(block_size, t), min(block_size, s), s)
  q, query_slots = _padded(q, sizes[0], 1, 0), _padded(query_slots, sizes[0], 0, 0)
  if layer is not None:  # S is a multiple of the block (`attention`)
    return _flash_forward(q, keys, values, query_slots, key_valid, sizes, layer)[0][:, :t]
  keys, values = _padded(keys, sizes[1], 2, 0), _padded(values, sizes[1], 2, 0)
  key_valid = _padded(key_valid, sizes[1], 1, False)
  return _flash(q, keys, values, query_slots, key_valid, sizes)[:, :t]


class _KeyBlock(NamedTuple):
  """Key block j's keys, values [B, KV, k, hd] and visibility to a query block."""

  keys: Array
  values: Array
  visible: Array  # [B, 1, 1, q, k]
  real: Array  # [k]: False for the slots that pad the last block


def _key_block(keys, values, key_valid, q_slots, j, k_size: int, length: int,
               layer=None) -> _KeyBlock:
  """Key block j; keys and values [B, KV, S, hd], or stacked [n_layers, B, KV, S, hd] and
  read at `layer`."""
  if layer is None:
    read = lambda x: _block(x, j, k_size, 2)
  else:
    read = lambda x: jax.lax.dynamic_slice(x, (layer, 0, 0, j * k_size, 0),
                                           (1, *x.shape[1:3], k_size, x.shape[4]))[0]
  slots = j * k_size + jnp.arange(k_size)
  return _KeyBlock(read(keys), read(values),
                   _visible(q_slots, slots, _block(key_valid, j, k_size, 1)), slots < length)


def _key_blocks(q_slots, k_size: int, slots: int):
  """How many key blocks a query block reads: those up to its last slot (the later ones
  hold no key it may see)."""
  return jnp.minimum(jnp.max(q_slots) // k_size + 1, slots // k_size)


def _seen(m):
  """Whether each query row saw a key: its running max passed the masked score."""
  return m > _MASKED


def _block_scores(q_block, kb: _KeyBlock):
  return jnp.where(kb.real, _scores(q_block, kb.keys, kb.visible), _PADDING)


def _query_blocks(q, query_slots, q_size: int):
  """[n, B, q, KV, G, hd] and [n, q]: the query blocks, for `lax.scan`."""
  b, t = q.shape[:2]
  blocks = jnp.moveaxis(q.reshape(b, t // q_size, q_size, *q.shape[2:]), 1, 0)
  return blocks, query_slots.reshape(t // q_size, q_size)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, keys, values, query_slots, key_valid, sizes):
  return _flash_forward(q, keys, values, query_slots, key_valid, sizes)[0]


def _flash_forward(q, keys, values, query_slots, key_valid, sizes, layer=None):
  """Output [B, T, KV, G, hd] and each query row's running max m and normaliser
  l ([n, B, KV, G, q]), which the backward pass needs to recompute the probabilities.
  With `layer`, keys and values are a stacked cache (`_key_block`)."""
  q_size, k_size, length = sizes
  # Ties the masks' inputs to q: under rematerialisation, values that depend only on
  # undifferentiated inputs are computed once and stored, and the masks of every
  # (query block, key block) pair would be, [blocks^2, block, block]; now they are
  # recomputed block by block.
  q, query_slots, key_valid = jax.lax.optimization_barrier((q, query_slots, key_valid))

  def query_block(_, block):
    q_block, q_slots = block

    def key_block(j, carry):
      m, l, acc = carry
      kb = _key_block(keys, values, key_valid, q_slots, j, k_size, length, layer)
      scores = _block_scores(q_block, kb)
      m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
      p = jnp.exp(scores - m_new[..., None])
      correction = jnp.exp(m - m_new)
      l = l * correction + jnp.sum(p, axis=-1)
      acc = acc * correction[..., None] + jnp.einsum(
          "bkgts,bksd->bkgtd", p.astype(values.dtype), kb.values,
          preferred_element_type=jnp.float32)
      return m_new, l, acc

    b, _, n_kv, group, hd = q_block.shape
    rows = (b, n_kv, group, q_size)
    init = (jnp.full(rows, _MASKED), jnp.zeros(rows), jnp.zeros((*rows, hd)))
    m, l, acc = jax.lax.fori_loop(0, _key_blocks(q_slots, k_size, keys.shape[-2]), key_block,
                                  init)
    out = jnp.where(_seen(m)[..., None], acc / l[..., None], 0.0)
    return None, (jnp.einsum("bkgtd->btkgd", out).astype(values.dtype), m, l)

  _, (out, m, l) = jax.lax.scan(query_block, None, _query_blocks(q, query_slots, q_size))
  out = jnp.moveaxis(out, 0, 1).reshape(q.shape)
  return out, (q, keys, values, query_slots, key_valid, out, m, l)


def _flash_backward(sizes, residuals, d_out):
  """The flash attention backward pass (Dao et al., 2022): per query block and
  key block, recompute p = exp(z - m) / l and, with D = sum_d dO * O per row,

    dV += p^T dO,   dz = p * (dO V^T - D),   dQ += dz K / sqrt(hd),
    dK += dz^T Q / sqrt(hd),

  dz being 0 where a key is not visible (its score is the constant _MASKED).
  Holds one [B, KV, G, q, k] block of scores at a time; dK and dV accumulate
  in float32 across query blocks."""
  q_size, k_size, length = sizes
  q, keys, values, query_slots, key_valid, out, m, l = residuals
  scale = 1 / jnp.sqrt(q.shape[-1])
  d_out = d_out.astype(jnp.float32)
  row_dot = jnp.einsum("btkgd,btkgd->bkgt", d_out, out.astype(jnp.float32))
  b, t, n_kv, group, hd = q.shape
  per_block = lambda x: jnp.moveaxis(x.reshape(b, n_kv, group, t // q_size, q_size), 3, 0)

  def query_block(d_kv, block):
    q_block, q_slots, d_out_block, m_block, l_block, dot_block = block
    rows = jnp.where(_seen(m_block), 1 / l_block, 0.0)[..., None]  # 0: a row that sees no key

    def key_block(j, carry):
      d_q, d_keys, d_values = carry
      kb = _key_block(keys, values, key_valid, q_slots, j, k_size, length)
      p = jnp.exp(_block_scores(q_block, kb) - m_block[..., None]) * rows
      d_values = _add_block(d_values, j, k_size, jnp.einsum("bkgts,btkgd->bksd", p, d_out_block))
      d_p = jnp.einsum("btkgd,bksd->bkgts", d_out_block, kb.values,
                       preferred_element_type=jnp.float32)
      d_z = jnp.where(kb.visible, p * (d_p - dot_block[..., None]), 0.0) * scale
      d_q += jnp.einsum("bkgts,bksd->btkgd", d_z, kb.keys, preferred_element_type=jnp.float32)
      d_keys = _add_block(d_keys, j, k_size, jnp.einsum(
          "bkgts,btkgd->bksd", d_z, q_block, preferred_element_type=jnp.float32))
      return d_q, d_keys, d_values

    init = (jnp.zeros(q_block.shape, jnp.float32), *d_kv)
    d_q, *d_kv = jax.lax.fori_loop(0, _key_blocks(q_slots, k_size, keys.shape[2]), key_block,
                                   init)
    return tuple(d_kv), d_q.astype(q.dtype)

  blocks = (*_query_blocks(q, query_slots, q_size), _query_blocks(d_out, query_slots, q_size)[0],
            m, l, per_block(row_dot))
  zeros = jnp.zeros(keys.shape, jnp.float32)
  (d_keys, d_values), d_q = jax.lax.scan(query_block, (zeros, zeros), blocks)
  d_q = jnp.moveaxis(d_q, 0, 1).reshape(q.shape)
  return d_q, d_keys.astype(keys.dtype), d_values.astype(values.dtype), None, None


def _add_block(total: Array, j, size: int, block: Array) -> Array:
  """total [B, KV, S, hd] with `block` added at slots [j * size, (j + 1) * size)."""
  return jax.lax.dynamic_update_slice_in_dim(total, _block(total, j, size, 2) + block,
                                             j * size, axis=2)


_flash.defvjp(_flash_forward, _flash_backward)
