"""Per-token log-probabilities and entropies of a policy's logits.

Shapes: logits `[..., V]` with tokens `[...]` (typically `[B, T, V]` and
`[B, T]`); hidden states `[B, T, D]` with an unembedding `[D, V]`. All
reductions run in float32 whatever the input dtype.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxcredit import _checks


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
  """log pi(token) = log_softmax(logits / temperature)[token].

  logits: [..., V] (any float dtype; upcast to float32). tokens: [...] ints.
  Returns float32 [...]. Use the sampling temperature so that ratios against
  the sampler's behaviour log-probs are consistent. Ids outside [0, V) raise
  ValueError when `tokens` is concrete; under jit they give NaN (and no
  gradient), never the log-prob of another token.
  """
  _check_logits_tokens(logits, tokens)
  _check_token_ids(tokens, logits.shape[-1])
  logits = logits.astype(jnp.float32) / temperature
  return _picked_logprob(logits, tokens, jax.nn.logsumexp(logits, axis=-1))


def token_entropy(logits: Array) -> Array:
  """Entropy of softmax(logits): H = logsumexp(z) - sum_v p_v z_v.

  logits: [..., V]; -inf logits (banned tokens) are allowed and contribute 0.
  Returns float32 [...].
  """
  logits = logits.astype(jnp.float32)
  probs = jax.nn.softmax(logits, axis=-1)
  finite_logits = jnp.where(jnp.isfinite(logits), logits, 0.0)
  return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(probs * finite_logits, axis=-1)


def _to_chunks(x: Array, chunk_size: int, fill=0) -> Array:
  """[B, T, ...] -> [n_chunks, B, chunk_size, ...], padding T with `fill`."""
  b, t = x.shape[:2]
  n = -(-t // chunk_size)
  x = jnp.pad(x, [(0, 0), (0, n * chunk_size - t)] + [(0, 0)] * (x.ndim - 2),
              constant_values=fill)
  return jnp.swapaxes(x.reshape(b, n, chunk_size, *x.shape[2:]), 0, 1)


def _from_chunks(x: Array, t: int) -> Array:
  """[n_chunks, B, chunk_size, ...] -> [B, T, ...]."""
  n, b, c = x.shape[:3]
  return jnp.swapaxes(x, 0, 1).reshape(b, n * c, *x.shape[3:])[:, :t]


class _Head(NamedTuple):
  """Static settings of the chunked head (hashable)."""

  chunk_size: int
  temperature: float
  vocab_major: bool  # unembed stored [V, D] (a tied embedding table) rather than [D, V]
  with_entropy: bool


def _einsum(spec: str, x, y):
  return jnp.einsum(spec, x, y, preferred_element_type=jnp.float32)


def _chunk_logits(hidden_chunk, unembed, allowed_chunk, head: _Head):
  """float32 [B, c, V] logits / temperature, -inf where not allowed."""
  spec = "bcd,vd->bcv" if head.vocab_major else "bcd,dv->bcv"
  logits = _einsum(spec, hidden_chunk, unembed) / head.temperature
  return logits if allowed_chunk is None else jnp.where(allowed_chunk, logits, -jnp.inf)


def _entropy(logits, lse):
  """Entropy of softmax over [..., V] float32 logits with their logsumexp: lse - sum_v p_v z_v
  (-inf logits contribute 0)."""
  probs = jnp.exp(logits - lse[..., None])
  finite = jnp.where(jnp.isfinite(logits), logits, 0.0)
  return lse - jnp.sum(probs * finite, axis=-1)


def _allowed_chunks(allowed, chunk_size: int):
  """allowed [T, V] or [B, T, V] -> [n, 1 or B, c, V] chunks, padded with True."""
  if allowed is None:
    return None
  return _to_chunks(allowed[None] if allowed.ndim == 2 else allowed, chunk_size, fill=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _chunked_head(hidden, unembed, tokens, allowed, head: _Head):
  outputs, _ = _chunked_head_fwd(hidden, unembed, tokens, allowed, head)
  return outputs


def _chunked_head_fwd(hidden, unembed, tokens, allowed, head: _Head):
  def step(_, chunk):
    hidden_chunk, token_chunk, allowed_chunk = chunk
    logits = _chunk_logits(hidden_chunk, unembed, allowed_chunk, head)
    lse = jax.nn.logsumexp(logits, axis=-1)
    entropy = _entropy(logits, lse) if head.with_entropy else jnp.zeros_like(lse)
    return None, (_picked_logprob(logits, token_chunk, lse), entropy, lse)

  chunks = (_to_chunks(hidden, head.chunk_size), _to_chunks(tokens, head.chunk_size),
            _allowed_chunks(allowed, head.chunk_size))
  _, outputs = jax.lax.scan(step, None, chunks)
  logp, entropy, lse = (_from_chunks(x, tokens.shape[1]) for x in outputs)
  return (logp, entropy), (hidden, unembed, tokens, allowed, lse, entropy)


def _chunked_head_bwd(head: _Head, residuals, cotangents):
  """Loops over vocabulary chunks of Vc = ceil(chunk_size * V / T) columns (the
  forward's logits budget) and recomputes their logits z for every token
  (scaled by 1 / temperature, masked):

    d logp / d z = onehot(token) - p,   d H / d z = -p * (log p + H),

  both zero at tokens that are not allowed (p = 0 there) for an allowed token.
  Each chunk's d unembed columns are final when computed and written in place,
  so the only float32 accumulator is d hidden [B, T, D] - not a [D, V] one.
  The last chunk is shifted left to end at V; the columns it repeats are
  rewritten with the same values and kept out of d hidden."""
  hidden, unembed, tokens, allowed, lse, entropy = residuals
  g_logp, g_entropy = (x.astype(jnp.float32) for x in cotangents)
  vocab_axis = 0 if head.vocab_major else 1
  vocab, length = unembed.shape[vocab_axis], tokens.shape[1]
  size = min(vocab, -(-head.chunk_size * vocab // length))
  # An out-of-vocabulary id's log-prob is NaN and carries no gradient (as autodiff of
  # token_logprobs).
  g_logp = jnp.where(_in_vocab(tokens, vocab), g_logp, 0.0)

  def step(carry, j, entropy_terms: bool):
    d_hidden, d_unembed = carry
    start = jnp.minimum(j * size, vocab - size)
    columns = start + jnp.arange(size)
    weights = jax.lax.dynamic_slice_in_dim(unembed, start, size, vocab_axis)
    allowed_chunk = (None if allowed is None
                     else jax.lax.dynamic_slice_in_dim(allowed, start, size, allowed.ndim - 1))
    logits = _chunk_logits(hidden, weights, allowed_chunk, head)  # [B, T, Vc]
    probs = jnp.exp(logits - lse[..., None])
    d_logits = g_logp[..., None] * ((tokens[..., None] == columns) - probs)
    if entropy_terms:
      log_probs = jnp.where(jnp.isfinite(logits), logits - lse[..., None], 0.0)
      d_logits -= g_entropy[..., None] * probs * (log_probs + entropy[..., None])
    d_logits /= head.temperature
    spec = "btv,vd->btd" if head.vocab_major else "btv,dv->btd"
    d_hidden += _einsum(spec, jnp.where(columns >= j * size, d_logits, 0.0), weights)
    d_weights = _einsum("btd,btv->vd" if head.vocab_major else "btd,btv->dv", hidden, d_logits)
    d_unembed = jax.lax.dynamic_update_slice_in_dim(d_unembed, d_weights.astype(unembed.dtype),
                                                    start, vocab_axis)
    return (d_hidden, d_unembed), None

  def loop(entropy_terms: bool):
    init = (jnp.zeros(hidden.shape, jnp.float32), jnp.zeros_like(unembed))
    chunks = jnp.arange(-(-vocab // size))
    return jax.lax.scan(functools.partial(step, entropy_terms=entropy_terms), init, chunks)[0]

  if head.with_entropy:
    # A loss without an entropy term gives the entropy a zero cotangent: the
    # loop without its terms runs then.
    d_hidden, d_unembed = jax.lax.cond(jnp.any(g_entropy != 0), lambda: loop(True),
                                       lambda: loop(False))
  else:
    d_hidden, d_unembed = loop(False)
  return d_hidden.astype(hidden.dtype), d_unembed, None, None


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
) -> tuple[Array, Array]:
  """(log pi(token), H(pi)) of pi = softmax(mask(hidden @ unembed) / temperature),
  without materialising [B, T, V].

  hidden: [B, T, D]; unembed: [D, V], or [V, D] with vocab_major=True (a tied
  embedding table used in place, no transposed copy); tokens: [B, T];
  allowed: None, [T, V] or [B, T, V] bool (tokens outside it get logit -inf,
  so pi is the renormalised restricted softmax, as `sampling.mask_logits`).
  The forward cuts the time axis into chunks of `chunk_size` and holds one
  chunk's logits [B, chunk_size, V] at a time; the backward recomputes the
  logits a vocabulary chunk [B, T, Vc] at a time (the same number of logits)
  and writes each chunk's d unembed columns in place, so peak memory is
  O(B * chunk * V + B * T * D), with no [D, V] accumulator. Matmuls
  accumulate in float32. Returns float32 [B, T]
  twice; equals token_logprobs / token_entropy of the full logits, gradients
  included. Out-of-range ids are handled as in `token_logprobs`.
  """
  return _chunked(hidden, unembed, tokens, chunk_size, temperature, allowed, vocab_major,
                  with_entropy=True)


def chunked_token_logprobs(
    hidden: Array,
    unembed: Array,
    tokens: Array,
    *,
    chunk_size: int,
    temperature: float = 1.0,
    allowed: Array | None = None,
    vocab_major: bool = False,
) -> Array:
  """token_logprobs(hidden @ unembed, tokens) without materialising [B, T, V].

  The log-probs of `chunked_token_logprobs_and_entropy` (same arguments), without
  the entropy's work. hidden: [B, T, D]; unembed: [D, V] ([V, D] with
  vocab_major); tokens: [B, T]. Returns float32 [B, T].
  """
  return _chunked(hidden, unembed, tokens, chunk_size, temperature, allowed, vocab_major,
                  with_entropy=False)[0]


def _chunked(hidden, unembed, tokens, chunk_size, temperature, allowed, vocab_major, *,
             with_entropy):
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
  shapes = ((tokens.shape[1], vocab), (*tokens.shape, vocab))
  if allowed is not None and allowed.shape not in shapes:
    raise ValueError(f"allowed must be [T, V] or [B, T, V] = {[*tokens.shape, vocab]}, got "
                     f"{list(allowed.shape)}.")
  if not isinstance(chunk_size, int) or chunk_size < 1:
    raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}.")
  _check_token_ids(tokens, vocab)
  if jnp.dtype(hidden.dtype).itemsize < jnp.dtype(unembed.dtype).itemsize:
    unembed = unembed.astype(hidden.dtype)  # the model's own logits matmul runs in hidden's dtype
  allowed = None if allowed is None else jnp.asarray(allowed, bool)
  head = _Head(chunk_size, float(temperature), bool(vocab_major), with_entropy)
  return _chunked_head(hidden, unembed, tokens, allowed, head)


LOG_RATIO_BOUND = 20.0
"""|log-ratio| above which `importance_ratio` saturates (as verl's policy losses)."""


def importance_ratio(log_ratio: Array, *, bound: float = LOG_RATIO_BOUND) -> Array:
  """exp(clip(log_ratio, -bound, bound)): a ratio that cannot overflow.

  exp overflows float32 at log-ratio ~88.7 (a stale behaviour policy in
  off-policy or asynchronous training reaches that), and an inf ratio gives a
  NaN gradient even where a clip or `where` discards it. Beyond +-bound the
  ratio is constant (gradient 0): e^20 ~ 4.9e8 is far outside any trust
  region. Returns float32 of log_ratio's shape.
  """
  return jnp.exp(jnp.clip(log_ratio.astype(jnp.float32), -bound, bound))


def token_sum_probs_squared(logits: Array) -> Array:
  """sum_v softmax(logits)_v^2 = exp(logsumexp(2 z) - 2 logsumexp(z)).

  The collision probability of the policy at each position; with the sampled
  token's probability p it gives ||e_a - pi||^2 = 1 - 2 p + sum pi^2, the
  logit-gradient proxy of the optimal token baseline. logits: [..., V].
  Returns float32 [...].
  """
  logits = logits.astype(jnp.float32)
  return jnp.exp(jax.nn.logsumexp(2.0 * logits, axis=-1) - 2.0 * jax.nn.logsumexp(logits, axis=-1))
