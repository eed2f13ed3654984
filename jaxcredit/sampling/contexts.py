"""Sampling that keeps its KV cache between calls: what a multi-turn sampler holds between
turns, so that a turn prefills only what is new.

`start_contexts` prefills rows, `extend_contexts` appends a chunk to each (an environment's
observation), `continue_contexts` samples after them as `jaxcredit.sampling.generate` samples
after a prompt (the same draws for the same key), and its tokens join the contexts;
`clear_contexts` empties rows, so that a row can take a new context (the next episode) while
the others keep theirs.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import Array

from jaxcredit import _checks
from jaxcredit.models.transformer import KVCache, Transformer
from jaxcredit.sampling.sampler import _decode, _extend, _Sampling


class Contexts(NamedTuple):
  """Rows' contexts held in a KV cache and grown chunk by chunk: what a multi-turn sampler
  keeps between turns, so that a turn prefills only what is new.

  Attributes:
    cache: a `KVCache` of S slots; slots ``[0, slot)`` are written (pads among them
      invalid).
    logits: ``[B, V]`` float32 next-token logits after each row's last token.
    length: ``[B]`` int32 tokens in each row (its next RoPE position).
    slot: ``[]`` int32 the first unwritten slot, the same for every row.
  """

  cache: KVCache
  logits: Array
  length: Array
  slot: Array


class Continuation(NamedTuple):
  """What `continue_contexts` sampled, as `SampleOutput`'s response columns.

  Attributes:
    tokens: ``[B, N]`` int.
    mask: ``[B, N]`` bool, the sampled tokens.
    logprobs: ``[B, N]`` float32.
    entropy: ``[B, N]`` float32.
    truncated: ``[B]`` bool, rows cut off at N tokens.
    decode_steps: ``[]`` int, the decode steps run.
  """

  tokens: Array
  mask: Array
  logprobs: Array
  entropy: Array
  truncated: Array
  decode_steps: Array


def start_contexts(model: Transformer, tokens: Array, token_valid: Array, *,
                   slots: int) -> Contexts:
  """Contexts of `slots` cache slots holding left-padded rows at slots ``[0, W)``.

  Args:
    model: the policy, a `Transformer`.
    tokens: ``[B, W]`` int, left-padded, W <= slots.
    token_valid: ``[B, W]`` bool.
    slots: the cache's size.

  Returns:
    the `Contexts`.

  Raises:
    ValueError: on mismatched shapes or more columns than slots.
  """
  _checks.check_rank(tokens, 2, "tokens")
  _checks.check_same_shape(tokens=tokens, token_valid=token_valid)
  if tokens.shape[1] > slots:
    raise ValueError(f"start_contexts: {tokens.shape[1]} columns do not fit in {slots} slots.")
  graphdef, state = nnx.split(model)
  return _start(graphdef, state, jnp.asarray(tokens), jnp.asarray(token_valid, bool), slots)


def extend_contexts(model: Transformer, contexts: Contexts, tokens: Array,
                    token_valid: Array) -> Contexts:
  """Contexts with a left-padded chunk appended to each row at slots ``[slot, slot + W)``.

  A row's valid tokens follow its context; a row with none is unchanged. The cache is
  donated: `contexts` must not be used afterwards.

  Args:
    model: the policy, a `Transformer`.
    contexts: from `start_contexts`, `extend_contexts` or `continue_contexts`.
    tokens: ``[B, W]`` int, left-padded.
    token_valid: ``[B, W]`` bool.

  Returns:
    the extended `Contexts`.

  Raises:
    ValueError: on mismatched shapes, or when the chunk does not fit in the cache.
  """
  _checks.check_same_shape(tokens=tokens, token_valid=token_valid)
  free = contexts.cache.key_valid.shape[1] - int(contexts.slot)
  if tokens.shape[1] > free:
    raise ValueError(f"extend_contexts: {tokens.shape[1]} columns do not fit in the cache's "
                     f"{free} free slots.")
  graphdef, state = nnx.split(model)
  return _extend_jit(graphdef, state, contexts, jnp.asarray(tokens),
                     jnp.asarray(token_valid, bool))


def clear_contexts(contexts: Contexts, rows: Array) -> Contexts:
  """Contexts with `rows` emptied: their cache slots are no longer attended to and their
  positions restart at 0, so the next chunk `extend_contexts` writes to such a row is a new
  context that sees nothing of the old one. The other rows are unchanged.

  Args:
    contexts: from `start_contexts`, `extend_contexts` or `continue_contexts`.
    rows: ``[B]`` bool, the rows to empty.

  Returns:
    the `Contexts`.

  Raises:
    ValueError: when `rows` is not ``[B]``.

  Examples:
    >>> from flax import nnx
    >>> from jaxcredit.models import Transformer, preset
    >>> model = Transformer(preset("tiny", vocab_size=16), rngs=nnx.Rngs(0))
    >>> contexts = start_contexts(model, jnp.ones((2, 3), int), jnp.ones((2, 3), bool),
    ...                           slots=8)
    >>> cleared = clear_contexts(contexts, jnp.array([True, False]))
    >>> cleared.length.tolist(), cleared.cache.key_valid[:, :3].tolist()
    ([0, 3], [[False, False, False], [True, True, True]])
  """
  _checks.check_shape(rows, contexts.length.shape, "rows")
  rows = jnp.asarray(rows, bool)
  cache = contexts.cache._replace(key_valid=contexts.cache.key_valid & ~rows[:, None])
  return contexts._replace(cache=cache, length=jnp.where(rows, 0, contexts.length))


def continue_contexts(model: Transformer, contexts: Contexts, key: Array, *, max_new_tokens: int,
                      done: Array, temperature: float = 1.0, stop_tokens: tuple[int, ...] = (),
                      pad_id: int = 0, allowed: Array | None = None, hidden: Array | None = None,
                      hidden_token: int = 0) -> tuple[Continuation, Contexts]:
  """Samples up to `max_new_tokens` per row after its context, as `generate` samples after a
  prompt (the same draws for the same key). The sampled tokens join the contexts (a hidden
  one as `hidden_token`); the cache is donated.

  Args:
    model: the policy, a `Transformer`.
    contexts: from `start_contexts` or `extend_contexts`.
    key: a PRNG key, or ``[B]`` keys, one per row (a row's draws then depend on its own key
      and context only).
    max_new_tokens: tokens to sample per row at most.
    done: ``[B]`` bool, rows that sample nothing.
    temperature: >= 0 (0 is greedy).
    stop_tokens: ids that end a row.
    pad_id: the id after a row ends.
    allowed: ``[V]`` bool, or None: the ids the policy may emit (`sampling.Actions.allowed`).
    hidden: ``[B, N]`` bool, or None: the new tokens recorded as sampled but fed to the model
      as `hidden_token` (`sampling.Actions.hidden`).
    hidden_token: the id fed in place of a hidden token.

  Returns:
    ``(continuation, contexts)``: the `Continuation` sampled (tokens, mask, log-probs,
    entropies, truncation), and the contexts with it appended.

  Raises:
    ValueError: when the cache has fewer than max_new_tokens free slots.
  """
  free = contexts.cache.key_valid.shape[1] - int(contexts.slot)
  if max_new_tokens > free:
    raise ValueError(f"continue_contexts: {max_new_tokens} new tokens do not fit in the "
                     f"cache's {free} free slots.")
  settings = _Sampling(max_new_tokens, float(temperature), None, None,
                       tuple(int(t) for t in stop_tokens), int(pad_id), int(hidden_token), True)
  graphdef, state = nnx.split(model)
  vocab = contexts.logits.shape[-1]
  if allowed is not None:
    _checks.check_shape(allowed, (vocab,), "allowed")
  allowed = jnp.broadcast_to(jnp.ones(vocab, bool) if allowed is None else allowed,
                             (max_new_tokens, 1, vocab))
  if hidden is None:
    hidden = jnp.zeros((max_new_tokens, 1), bool)
  else:
    _checks.check_shape(hidden, (contexts.logits.shape[0], max_new_tokens), "hidden")
    hidden = jnp.asarray(hidden, bool).T
  return _continue_rows(graphdef, state, contexts, jnp.asarray(done, bool), key, allowed, hidden,
                        settings)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _start(graphdef, state, tokens, token_valid, slots: int) -> Contexts:
  model = nnx.merge(graphdef, state)
  batch = tokens.shape[0]
  logits = jnp.zeros((batch, model.config.vocab_size), jnp.float32)
  cache, logits, length = _extend(model, KVCache.zeros(model.config, batch, slots), logits,
                                  jnp.zeros(batch, jnp.int32), 0, tokens, token_valid, None)
  return Contexts(cache, logits, length, jnp.int32(tokens.shape[1]))


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def _extend_jit(graphdef, state, contexts: Contexts, tokens, token_valid) -> Contexts:
  model = nnx.merge(graphdef, state)
  cache, logits, length = _extend(model, contexts.cache, contexts.logits, contexts.length,
                                  contexts.slot, tokens, token_valid, None)
  return Contexts(cache, logits, length, contexts.slot + tokens.shape[1])


@functools.partial(jax.jit, static_argnums=(0, 7), donate_argnums=(2,))
def _continue_rows(graphdef, state, contexts: Contexts, done, key, allowed, hidden,
                  settings: _Sampling) -> tuple[Continuation, Contexts]:
  """`continue_contexts` on a split model, with the step-major response tables of
  `_response_tables` (allowed [N, V] or [N, B, V], hidden [N] or [N, B]: hidden steps are fed
  as `settings.hidden_token`)."""
  model = nnx.merge(graphdef, state)
  buffers, done, decode_steps, cache, logits, length = _decode(
      model, contexts.cache, contexts.logits, contexts.length, contexts.slot, done, key, allowed,
      hidden, settings, model.unstacked_layers())
  tokens, logprobs, entropy, mask = (jnp.swapaxes(x, 0, 1) for x in buffers)
  truncated = ~done if settings.stop_tokens else jnp.zeros_like(done)
  return (Continuation(tokens, mask, logprobs, entropy, truncated, decode_steps),
          Contexts(cache, logits, length, contexts.slot + decode_steps))
