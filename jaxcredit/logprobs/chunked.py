"""Per-token log-probabilities and entropies from hidden states and an unembedding, without
materialising the logits: a chunk of positions, and in the backward a slice of the vocabulary,
at a time.

Shapes: hidden states `[B, T, D]` with an unembedding `[D, V]` (or `[V, D]`, a tied embedding
table) and tokens `[B, T]`. All reductions run in float32 whatever the input dtype.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit.logprobs.dense import _check_token_ids, _in_vocab, _picked_logprob


class _Head(NamedTuple):
  """Static settings of the chunked head (hashable)."""

  chunk_size: int  # positions per chunk in each block of rows
  row_blocks: int  # R: blocks of consecutive rows packed apart (the devices the batch spans)
  temperature: float
  vocab_major: bool  # unembed stored [V, D] (a tied embedding table) rather than [D, V]
  with_entropy: bool


ACCUMULATOR_SHARE = 4
"""The backward's d unembed accumulator [D, Vc] holds at most 1 / ACCUMULATOR_SHARE
as many float32 numbers as a chunk of logits."""


def _einsum(spec: str, x, y):
  return jnp.einsum(spec, x, y, preferred_element_type=jnp.float32)


def _rows_logits(hidden_rows, weights, allowed_rows, head: _Head):
  """float32 [n, Vc] logits / temperature of [n, D] hidden rows, -inf where not allowed.

  Two-dimensional on purpose: XLA:CPU reduces a [1, c, V] array ~20x slower than
  [c, V] and transposes logits rather than hidden rows for [1, c, ...] matmuls."""
  spec = "nd,vd->nv" if head.vocab_major else "nd,dv->nv"
  logits = _einsum(spec, hidden_rows, weights) / head.temperature
  if allowed_rows is None:
    return logits
  allowed_rows = allowed_rows if allowed_rows.ndim == 1 else allowed_rows.reshape(logits.shape)
  return jnp.where(allowed_rows, logits, -jnp.inf)


def _entropy(logits, lse):
  """Entropy of softmax over [..., V] float32 logits with their logsumexp: lse - sum_v p_v z_v
  (-inf logits contribute 0)."""
  probs = jnp.exp(logits - lse[..., None])
  finite = jnp.where(jnp.isfinite(logits), logits, 0.0)
  return lse - jnp.sum(probs * finite, axis=-1)


class _Packing(NamedTuple):
  """The scored positions of each block of rows, gathered to the front of its flat
  order: block r holds rows [r * B / R, (r + 1) * B / R) as M = B / R * T positions."""

  order: Array  # [R, P] int32: block positions m = (b mod B / R) * T + t, scored ones first,
  #               padded with 0 to P = whole chunks
  count: Array  # [R] int32: how many leading entries of each block's order are scored

  def slot_in_use(self) -> Array:
    return jnp.arange(self.order.shape[1]) < self.count[:, None]

  def chunks_in_use(self, chunk: int) -> Array:
    """How many leading chunks of `chunk` slots hold a scored position in some block."""
    return -(-jnp.max(self.count) // chunk)


def _packing(where, shape, blocks: int, chunk: int) -> _Packing:
  """Each block's scored positions first (in row-major order), padded to whole chunks."""
  positions = shape[0] * shape[1] // blocks
  padding = [(0, 0), (0, -(-positions // chunk) * chunk - positions)]
  if where is None:
    order = jnp.broadcast_to(jnp.arange(positions, dtype=jnp.int32), (blocks, positions))
    return _Packing(jnp.pad(order, padding), jnp.full((blocks,), positions, jnp.int32))
  flat = where.reshape(blocks, positions)
  order = jnp.argsort(~flat, axis=1, stable=True).astype(jnp.int32)
  return _Packing(jnp.pad(order, padding), jnp.sum(flat, axis=1, dtype=jnp.int32))


def _unpack(packed, packing: _Packing, shape):
  """[R, P, ...] values in packed order -> [B, T, ...], 0 at positions not scored."""
  blocks, positions = packing.order.shape[0], shape[0] * shape[1] // packing.order.shape[0]
  trailing = packed.shape[2:]
  in_use = packing.slot_in_use()[:, :positions].reshape(blocks, positions, *[1] * len(trailing))
  values = jnp.where(in_use, packed[:, :positions], 0)
  scatter = lambda order, v: jnp.zeros((positions, *trailing), packed.dtype).at[order].set(
      v, unique_indices=True)
  return jax.vmap(scatter)(packing.order[:, :positions], values).reshape(*shape, *trailing)


def _take_rows(x, rows):
  """x [R, M, ...] at block positions rows [R, c] -> [R, c, ...]."""
  return jnp.take_along_axis(x, rows.reshape(*rows.shape, *[1] * (x.ndim - 2)), axis=1)


def _allowed_rows(allowed, rows, shape, blocks: int):
  """allowed [1 or B, T, V'] at block positions rows [R, c] -> [R, c, V'] (None and one [V']
  set for every position stay as they are)."""
  if allowed is None or allowed.ndim == 1:
    return allowed
  row = (jnp.arange(blocks)[:, None] * (shape[0] // blocks) + rows // shape[1]
         if allowed.shape[0] > 1 else jnp.zeros_like(rows))
  return allowed[row, rows % shape[1]]


def _chunk(x, i, chunk: int):
  """Chunk i of the packed axis (axis 1) of x [R, P, ...]."""
  return jax.lax.dynamic_slice_in_dim(x, i * chunk, chunk, axis=1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _chunked_head(hidden, unembed, tokens, allowed, where, head: _Head):
  outputs, _ = _chunked_head_fwd(hidden, unembed, tokens, allowed, where, head)
  return outputs


def _chunked_head_fwd(hidden, unembed, tokens, allowed, where, head: _Head):
  shape, chunk, blocks = tokens.shape, head.chunk_size, head.row_blocks
  packing = _packing(where, shape, blocks, chunk)
  block_hidden = hidden.reshape(blocks, -1, hidden.shape[-1])
  block_tokens = tokens.reshape(blocks, -1)

  def step(i, outputs):
    rows = _chunk(packing.order, i, chunk)
    logits = _rows_logits(_take_rows(block_hidden, rows).reshape(-1, hidden.shape[-1]), unembed,
                          _allowed_rows(allowed, rows, shape, blocks), head)  # [R * c, V]
    lse = jax.nn.logsumexp(logits, axis=-1)
    entropy = _entropy(logits, lse) if head.with_entropy else jnp.zeros_like(lse)
    logp = _picked_logprob(logits, _take_rows(block_tokens, rows).reshape(-1), lse)
    return tuple(jax.lax.dynamic_update_slice_in_dim(x, y.reshape(blocks, chunk), i * chunk, 1)
                 for x, y in zip(outputs, (logp, entropy, lse)))

  # A loop over the chunks in use only: those past every block's scored positions cost nothing.
  logp, entropy, lse = jax.lax.fori_loop(  # [R, P] each, packed order
      0, packing.chunks_in_use(chunk), step, (jnp.zeros(packing.order.shape, jnp.float32),) * 3)
  residuals = (hidden, unembed, tokens, allowed, packing, lse, entropy)
  return (_unpack(logp, packing, shape), _unpack(entropy, packing, shape)), residuals


def _chunked_head_bwd(head: _Head, residuals, cotangents):
  """Loops over vocabulary chunks of Vc columns (the d unembed accumulator [D, Vc]
  holds at most 1 / ACCUMULATOR_SHARE of a logits chunk) and, inside, over the
  forward's chunks of scored positions, recomputing their logits z (scaled by
  1 / temperature, masked):

    d logp / d z = onehot(token) - p,   d H / d z = -p * (log p + H),

  both zero at tokens that are not allowed (p = 0 there) for an allowed token.
  Chunks past the scored positions are skipped. Each vocabulary chunk's d unembed
  columns are final when its inner loop ends and are written in place, so the
  float32 accumulators are d hidden (packed, [R, P, D]) and one [D, Vc] - not a
  [D, V] one. The last vocabulary chunk is shifted left to end at V; the columns
  it repeats are rewritten with the same values and kept out of d hidden."""
  hidden, unembed, tokens, allowed, packing, lse, entropy = residuals
  shape, chunk, blocks = tokens.shape, head.chunk_size, head.row_blocks
  vocab_axis = 0 if head.vocab_major else 1
  vocab, width = unembed.shape[vocab_axis], hidden.shape[-1]
  size = min(vocab, max(1, blocks * chunk * vocab // (ACCUMULATOR_SHARE * width)))
  block_hidden = hidden.reshape(blocks, -1, width)
  tokens = _take_rows(tokens.reshape(blocks, -1), packing.order)
  # Packed cotangents; slots past the scored positions are masked out of d logits below.
  g_logp, g_entropy = (_take_rows(x.astype(jnp.float32).reshape(blocks, -1), packing.order)
                       for x in cotangents)
  # An out-of-vocabulary id's log-prob is NaN and carries no gradient (as autodiff of
  # token_logprobs).
  g_logp = jnp.where(_in_vocab(tokens, vocab), g_logp, 0.0)
  in_use = packing.slot_in_use()

  def vocab_step(carry, j):
    d_hidden, d_unembed = carry
    start = jnp.minimum(j * size, vocab - size)
    columns = start + jnp.arange(size)
    weights = jax.lax.dynamic_slice_in_dim(unembed, start, size, vocab_axis)
    allowed_columns = (None if allowed is None
                       else jax.lax.dynamic_slice_in_dim(allowed, start, size, allowed.ndim - 1))

    def token_step(i, inner):
      d_hidden, d_weights = inner
      rows = _chunk(packing.order, i, chunk)
      at = lambda x: _chunk(x, i, chunk).reshape(-1, 1)  # [R * c, 1]
      # Slots past a block's scored positions add nothing, even where their hidden state is NaN.
      hidden_rows = jnp.where(at(in_use), _take_rows(block_hidden, rows).reshape(-1, width), 0.0)
      logits = _rows_logits(hidden_rows, weights,
                            _allowed_rows(allowed_columns, rows, shape, blocks), head)
      # d z = g_logp onehot - p (g_logp + g_H (log p + H)), log p = z - lse: per element a
      # multiply-add beside the softmax's (a -inf logit has p = 0 and is read as 0).
      probs = jnp.exp(logits - at(lse))
      scale = at(g_logp)
      if head.with_entropy:
        finite = logits if allowed is None else jnp.where(jnp.isfinite(logits), logits, 0.0)
        scale = scale + at(g_entropy) * (finite - at(lse) + at(entropy))
      d_logits = (jnp.where(at(tokens) == columns, at(g_logp), 0.0) - probs * scale)
      d_logits = jnp.where(at(in_use), d_logits, 0.0) / head.temperature
      spec = "nv,vd->nd" if head.vocab_major else "nv,dv->nd"
      d_rows = _chunk(d_hidden, i, chunk) + _einsum(
          spec, jnp.where(columns >= j * size, d_logits, 0.0), weights).reshape(blocks, chunk, -1)
      # hidden rows transposed (small) rather than d_logits (a logits chunk).
      d_weights += _einsum("dn,nv->dv", hidden_rows.T, d_logits)
      return jax.lax.dynamic_update_slice_in_dim(d_hidden, d_rows, i * chunk, 1), d_weights

    inner = (d_hidden, jnp.zeros((width, size), jnp.float32))  # d weights as [D, Vc]
    d_hidden, d_weights = jax.lax.fori_loop(0, packing.chunks_in_use(chunk), token_step, inner)
    d_weights = d_weights.T if head.vocab_major else d_weights
    d_unembed = jax.lax.dynamic_update_slice_in_dim(d_unembed, d_weights.astype(unembed.dtype),
                                                    start, vocab_axis)
    return (d_hidden, d_unembed), None

  init = (jnp.zeros((*packing.order.shape, width), jnp.float32), jnp.zeros_like(unembed))
  d_hidden, d_unembed = jax.lax.scan(vocab_step, init, jnp.arange(-(-vocab // size)))[0]
  d_hidden = _unpack(d_hidden, packing, shape).astype(hidden.dtype)
  return d_hidden, d_unembed, None, None, None


_chunked_head.defvjp(_chunked_head_fwd, _chunked_head_bwd)


def chunked_token_logprobs_and_entropy(
    hidden: Array,
    unembed: Array,
    tokens: Array,
    *,
    chunk_size: int,
    temperature: float = 1.0,
    allowed: Array | None = None,
    vocab_major: bool = False,
    where: Array | None = None,
    row_blocks: int = 1,
) -> tuple[Array, Array]:
  """Log-probs and entropies of ``pi = softmax(mask(hidden @ unembed) / temperature)``,
  without materialising ``[B, T, V]``.

  Each block's scored positions are gathered to the front of its flat order and cut into
  chunks of ``B / R * chunk_size`` positions; the forward holds one chunk's logits
  ``[B * chunk_size, V]`` at a time and skips chunks past the last scored position. The
  backward recomputes the logits a vocabulary chunk at a time over the same position chunks
  and writes each chunk's d unembed columns in place, so peak memory is
  ``O(B * chunk * V + B * T * D)``, with no ``[D, V]`` accumulator. Matmuls accumulate in
  float32.

  Args:
    hidden: ``[B, T, D]`` final hidden states.
    unembed: ``[D, V]``, or ``[V, D]`` with `vocab_major` (a tied embedding table used in
      place, no transposed copy).
    tokens: ``[B, T]`` int, the token scored at each position.
    chunk_size: positions per chunk and row (the forward holds ``B * chunk_size`` rows of
      logits at a time).
    temperature: the softmax temperature, > 0.
    allowed: None, ``[V]`` (the same set at every position), ``[T, V]`` or ``[B, T, V]``
      bool; tokens outside it get logit -inf, so pi is the renormalised restricted softmax,
      as `sampling.mask_logits`.
    vocab_major: `unembed` is ``[V, D]``.
    where: None (score every position) or ``[B, T]`` bool, the positions whose results are
      needed (an RL loss's action tokens): the others return 0 with no gradient and cost no
      logits, so a batch of short responses padded to a long row pays for its real tokens
      only.
    row_blocks: R, a divisor of B; the rows are packed in R blocks of consecutive rows, each
      on its own: the number of devices the batch is sharded over, so that packing never
      moves data between devices.

  Returns:
    ``(logprobs, entropy)``, float32 ``[B, T]`` each: `token_logprobs` and `token_entropy`
    of the full logits where scored (gradients included), 0 elsewhere. Out-of-range ids are
    handled as in `token_logprobs`.

  Raises:
    ValueError: on wrong ranks, mismatched widths, or concrete token ids outside the
    vocabulary.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from jaxcredit import logprobs
    >>> hidden = jax.random.normal(jax.random.key(0), (2, 5, 4))
    >>> unembed = jax.random.normal(jax.random.key(1), (4, 7))
    >>> tokens = jnp.array([[1, 2, 3, 4, 5], [6, 0, 1, 2, 3]])
    >>> logp, entropy = logprobs.chunked_token_logprobs_and_entropy(
    ...     hidden, unembed, tokens, chunk_size=2)
    >>> bool(np.allclose(logp, logprobs.token_logprobs(hidden @ unembed, tokens), atol=1e-5))
    True
  """
  return _chunked(hidden, unembed, tokens, chunk_size, temperature, allowed, vocab_major, where,
                  row_blocks, with_entropy=True)


def chunked_token_logprobs(
    hidden: Array,
    unembed: Array,
    tokens: Array,
    *,
    chunk_size: int,
    temperature: float = 1.0,
    allowed: Array | None = None,
    vocab_major: bool = False,
    where: Array | None = None,
    row_blocks: int = 1,
) -> Array:
  """``token_logprobs(hidden @ unembed, tokens)`` without materialising ``[B, T, V]``.

  The log-probs of `chunked_token_logprobs_and_entropy` (same arguments), without the
  entropy's work.

  Args:
    hidden: ``[B, T, D]`` final hidden states.
    unembed: ``[D, V]``, or ``[V, D]`` with `vocab_major` (a tied embedding table used in
      place, no transposed copy).
    tokens: ``[B, T]`` int, the token scored at each position.
    chunk_size: positions per chunk and row (the forward holds ``B * chunk_size`` rows of
      logits at a time).
    temperature: the softmax temperature, > 0.
    allowed: None, ``[V]`` (the same set at every position), ``[T, V]`` or ``[B, T, V]``
      bool; tokens outside it get logit -inf, so pi is the renormalised restricted softmax,
      as `sampling.mask_logits`.
    vocab_major: `unembed` is ``[V, D]``.
    where: None (score every position) or ``[B, T]`` bool, the positions whose results are
      needed (an RL loss's action tokens): the others return 0 with no gradient and cost no
      logits, so a batch of short responses padded to a long row pays for its real tokens
      only.
    row_blocks: R, a divisor of B; the rows are packed in R blocks of consecutive rows, each
      on its own: the number of devices the batch is sharded over, so that packing never
      moves data between devices.

  Returns:
    float32 ``[B, T]``, 0 at positions not scored.

  Raises:
    ValueError: on wrong ranks, mismatched widths, or concrete token ids outside the
    vocabulary.
  """
  return _chunked(hidden, unembed, tokens, chunk_size, temperature, allowed, vocab_major, where,
                  row_blocks, with_entropy=False)[0]


def _chunked(hidden, unembed, tokens, chunk_size, temperature, allowed, vocab_major, where,
             row_blocks, *, with_entropy):
  _checks.check_rank(hidden, 3, "hidden")
  _checks.check_rank(unembed, 2, "unembed")
  _checks.check_rank(tokens, 2, "tokens")
  width, vocab = unembed.shape[::-1] if vocab_major else unembed.shape
  layout = "[V,D]" if vocab_major else "[D,V]"
  if hidden.shape[:2] != tokens.shape or hidden.shape[2] != width:
    raise ValueError(
        f"Expected hidden[B,T,D], unembed{layout}, tokens[B,T]; got "
        f"hidden{list(hidden.shape)}, unembed{list(unembed.shape)}, "
        f"tokens{list(tokens.shape)}."
    )
  shapes = ((vocab,), (tokens.shape[1], vocab), (*tokens.shape, vocab))
  if allowed is not None and jnp.shape(allowed) not in shapes:
    raise ValueError(f"allowed must be [V], [T, V] or [B, T, V] = {[*tokens.shape, vocab]}, got "
                     f"{list(jnp.shape(allowed))}.")
  if not isinstance(chunk_size, int) or chunk_size < 1:
    raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}.")
  _check_token_ids(tokens, vocab)
  if jnp.dtype(hidden.dtype).itemsize < jnp.dtype(unembed.dtype).itemsize:
    unembed = unembed.astype(hidden.dtype)  # the model's own logits matmul runs in hidden's dtype
  if where is not None and jnp.shape(where) != tokens.shape:
    raise ValueError(f"where must be None or [B, T] = {list(tokens.shape)} like tokens, got "
                     f"{list(jnp.shape(where))}.")
  if allowed is not None:  # [V] (every position) or [1 or B, T, V]
    allowed = jnp.asarray(allowed, bool)
    allowed = allowed[None] if allowed.ndim == 2 else allowed
  where = None if where is None else jnp.asarray(where, bool)
  hidden, tokens = jnp.asarray(hidden), jnp.asarray(tokens)
  batch, length = tokens.shape
  if not isinstance(row_blocks, int) or row_blocks < 1 or batch % row_blocks:
    raise ValueError(f"row_blocks must be a positive int dividing the batch B = {batch}, got "
                     f"{row_blocks!r}.")
  head = _Head(batch // row_blocks * min(chunk_size, length), row_blocks, float(temperature),
               bool(vocab_major), with_entropy)
  return _chunked_head(hidden, unembed, tokens, allowed, where, head)
