"""Per-token log-probabilities and entropies of a policy's logits.

Shapes: logits `[..., V]` with tokens `[...]` (typically `[B, T, V]` and
`[B, T]`); hidden states `[B, T, D]` with an unembedding `[D, V]`. All
reductions run in float32 whatever the input dtype.
"""

import functools

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


def _to_chunks(x: Array, chunk_size: int) -> Array:
  """[B, T, ...] -> [n_chunks, B, chunk_size, ...], zero-padding T."""
  b, t = x.shape[:2]
  n = -(-t // chunk_size)
  x = jnp.pad(x, [(0, 0), (0, n * chunk_size - t)] + [(0, 0)] * (x.ndim - 2))
  return jnp.swapaxes(x.reshape(b, n, chunk_size, *x.shape[2:]), 0, 1)


def _from_chunks(x: Array, t: int) -> Array:
  """[n_chunks, B, chunk_size] -> [B, T]."""
  n, b, c = x.shape
  return jnp.swapaxes(x, 0, 1).reshape(b, n * c)[:, :t]


def _chunk_logits(hidden_chunk, unembed, temperature):
  logits = jnp.einsum(
      "bcd,dv->bcv", hidden_chunk, unembed, preferred_element_type=jnp.float32
  )
  return logits / temperature


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _chunked_logprobs(hidden, unembed, tokens, chunk_size, temperature):
  logp, _ = _chunked_logprobs_fwd(hidden, unembed, tokens, chunk_size, temperature)
  return logp


def _chunked_logprobs_fwd(hidden, unembed, tokens, chunk_size, temperature):
  def step(_, chunk):
    hidden_chunk, token_chunk = chunk
    logits = _chunk_logits(hidden_chunk, unembed, temperature)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return None, (_picked_logprob(logits, token_chunk, lse), lse)

  chunks = (_to_chunks(hidden, chunk_size), _to_chunks(tokens, chunk_size))
  _, (logp, lse) = jax.lax.scan(step, None, chunks)
  t = tokens.shape[1]
  return _from_chunks(logp, t), (hidden, unembed, tokens, _from_chunks(lse, t))


def _chunked_logprobs_bwd(chunk_size, temperature, residuals, g):
  """Recomputes each chunk's logits; d logp/d logits = onehot(token) - softmax."""
  hidden, unembed, tokens, lse = residuals

  def step(d_unembed, chunk):
    hidden_chunk, token_chunk, lse_chunk, g_chunk = chunk
    logits = _chunk_logits(hidden_chunk, unembed, temperature)
    probs = jnp.exp(logits - lse_chunk[..., None])
    onehot = jax.nn.one_hot(token_chunk, logits.shape[-1], dtype=jnp.float32)
    # An out-of-vocabulary id's log-prob is NaN and carries no gradient
    # (as autodiff of token_logprobs).
    g_chunk = jnp.where(_in_vocab(token_chunk, logits.shape[-1]), g_chunk, 0.0)
    d_logits = g_chunk[..., None] * (onehot - probs) / temperature
    d_hidden = jnp.einsum(
        "bcv,dv->bcd", d_logits, unembed, preferred_element_type=jnp.float32
    )
    d_unembed += jnp.einsum(
        "bcd,bcv->dv", hidden_chunk, d_logits, preferred_element_type=jnp.float32
    )
    return d_unembed, d_hidden.astype(hidden.dtype)

  chunks = tuple(
      _to_chunks(x, chunk_size) for x in (hidden, tokens, lse, g.astype(jnp.float32))
  )
  d_unembed0 = jnp.zeros(unembed.shape, jnp.float32)
  d_unembed, d_hidden = jax.lax.scan(step, d_unembed0, chunks)
  d_hidden = jnp.swapaxes(d_hidden, 0, 1).reshape(
      hidden.shape[0], -1, hidden.shape[2]
  )[:, : hidden.shape[1]]
  return d_hidden, d_unembed.astype(unembed.dtype), None


_chunked_logprobs.defvjp(_chunked_logprobs_fwd, _chunked_logprobs_bwd)


def chunked_token_logprobs(
    hidden: Array,
    unembed: Array,
    tokens: Array,
    *,
    chunk_size: int,
    temperature: float = 1.0,
) -> Array:
  """token_logprobs(hidden @ unembed, tokens) without materialising [B, T, V].

  hidden: [B, T, D]; unembed: [D, V]; tokens: [B, T]. The time axis is cut
  into chunks of `chunk_size`; forward and backward each hold one chunk's
  logits [B, chunk_size, V] at a time (the backward recomputes them and
  accumulates d unembed chunk by chunk), so peak memory is O(B * chunk * V).
  Matmuls accumulate in float32 (bf16 inputs are fine). Returns float32 [B, T].
  Out-of-range ids are handled as in `token_logprobs` (error or NaN).
  """
  _checks.check_rank(hidden, 3, "hidden")
  _checks.check_rank(unembed, 2, "unembed")
  _checks.check_rank(tokens, 2, "tokens")
  if hidden.shape[:2] != tokens.shape or hidden.shape[2] != unembed.shape[0]:
    raise ValueError(
        f"Expected hidden[B,T,D], unembed[D,V], tokens[B,T]; got "
        f"hidden{list(hidden.shape)}, unembed{list(unembed.shape)}, "
        f"tokens{list(tokens.shape)}."
    )
  if not isinstance(chunk_size, int) or chunk_size < 1:
    raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}.")
  _check_token_ids(tokens, unembed.shape[1])
  return _chunked_logprobs(hidden, unembed, tokens, chunk_size, float(temperature))


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
