"""Jitted generation with a KV cache: prefill the prompt, then decode token by token.

Prompts are [B, P] token ids with a validity mask (left- or right-padded).
The output lays prompt and response side by side in [B, P + N] slots, the
prompt left-padded, so rows of a batch stay aligned:

  tokens     [B, P + N] int   prompt (left-padded) then the sampled response
  mask       [B, P + N] bool  response tokens that are policy actions: every
                              sampled token up to and including a stop token
  logprobs   [B, P + N]       behaviour log-probs log_softmax(logits / T)[token]
                              at response positions (0 elsewhere)
  entropy    [B, P + N]       entropy of softmax(logits / T) there
  token_valid[B, P + N] bool  prompt tokens and response tokens (for teacher forcing)
  positions  [B, P + N] int   RoPE positions (0 at each row's first prompt token)
  truncated  [B] bool         cut off by the budget: stop tokens were given and
                              none was sampled in max_new_tokens (always False
                              without stop tokens: fixed-length responses)
  decode_steps []   int        decode steps run: N, or fewer when every row
                              stopped early (`stop_when_done`)

Multi-turn sampling keeps the cache between calls (`Contexts`): `start_contexts`
prefills rows, `extend_contexts` appends a chunk to each (an environment's
observation), `continue_contexts` samples after them as `generate` samples after
a prompt (the same draws for the same key), and its tokens join the contexts;
`clear_contexts` empties rows, so that a row can take a new context (the next
episode) while the others keep theirs.

The behaviour log-probs are those of the temperature-scaled distribution
before top-k / top-p truncation - what a teacher-forced forward pass at the
same temperature computes, so PPO ratios start at exactly 1.

Tasks with typed action sets pass `actions` (`jaxcredit.sampling.Actions`
over the [P + N] output columns): at response column t only allowed[t] can be
sampled (the others get logit -inf, so pi is the renormalised constrained
softmax), and a hidden column's sampled token is recorded as the action but
fed back as `hidden_token` (hidden prompt columns are fed as it too). The
learner applies the same two transforms, so its log-probs match.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from jaxcredit import _checks
from jaxcredit.logprobs import token_entropy, token_logprobs
from jaxcredit.models.transformer import KVCache, Transformer
from jaxcredit.sampling.actions import Actions, mask_logits
from jaxcredit.sampling.draw import sample_token, step_key


class SampleOutput(NamedTuple):
  """What `generate` returns: the prompts and the sampled responses in one ``[B, P + N]``
  layout.

  Attributes:
    tokens: ``[B, P + N]`` int, the (left-padded) prompt then the response.
    mask: ``[B, P + N]`` bool, the sampled tokens (the policy's actions).
    logprobs: ``[B, P + N]`` float32, log pi of each sampled token, 0 elsewhere.
    entropy: ``[B, P + N]`` float32, the policy's entropy at each sampled token.
    token_valid: ``[B, P + N]`` bool, the real tokens (not padding).
    positions: ``[B, P + N]`` int, RoPE positions.
    truncated: ``[B]`` bool, rows that reached max_new_tokens without a stop token.
    decode_steps: ``[]`` int, the decode steps run.
  """
  tokens: Array
  mask: Array
  logprobs: Array
  entropy: Array
  token_valid: Array
  positions: Array
  truncated: Array
  decode_steps: Array


def left_align(prompts: Array, prompt_valid: Array) -> tuple[Array, Array]:
  """Right-padded prompts moved to the left-padded layout (valid tokens at the end).

  Args:
    prompts: ``[B, P]`` int, right-padded.
    prompt_valid: ``[B, P]`` bool.

  Returns:
    ``(prompts, prompt_valid)``, left-padded.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.sampling import sampler
    >>> sampler.left_align(jnp.array([[5, 6, 0]]), jnp.array([[True, True, False]]))[0]
    Array([[0, 5, 6]], dtype=int32)
  """
  length = prompts.shape[1]
  shift = length - jnp.sum(prompt_valid, axis=1, keepdims=True)
  source = (jnp.arange(length)[None] - shift) % length
  return jnp.take_along_axis(prompts, source, 1), jnp.take_along_axis(prompt_valid, source, 1)


def prompt_positions(token_valid: Array) -> Array:
  """RoPE positions: 0 at each row's first valid token, counting valid tokens.

  Args:
    token_valid: ``[B, L]`` bool.

  Returns:
    int ``[B, L]``.
  """
  return jnp.maximum(jnp.cumsum(token_valid, axis=1) - 1, 0)


def _check_generate_args(prompts, prompt_valid, max_new_tokens, temperature, top_k, top_p, padding):
  _checks.check_rank(prompts, 2, "prompts")
  _checks.check_same_shape(prompts=prompts, prompt_valid=prompt_valid)
  _checks.check_choice(padding, ("left", "right"), "padding")
  if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}.")
  if temperature < 0:
    raise ValueError(f"temperature must be >= 0, got {temperature}.")
  if top_k is not None and top_k < 1:
    raise ValueError(f"top_k must be >= 1, got {top_k}.")
  if top_p is not None and not 0 < top_p <= 1:
    raise ValueError(f"top_p must be in (0, 1], got {top_p}.")


class _Sampling(NamedTuple):
  """Static sampling settings (hashable, for jit)."""

  max_new_tokens: int
  temperature: float
  top_k: int | None
  top_p: float | None
  stop_tokens: tuple[int, ...]
  pad_id: int
  hidden_token: int
  stop_when_done: bool
  # A row stops, without sampling, before a token whose entropy reaches this (not at the
  # first step): `sampling.tree`'s entropy forks. None: never.
  pause_entropy: float | None = None


def _response_step(logits, key, done, allowed, settings: _Sampling, may_pause=False):
  """Samples one token per row; returns (token, logp, entropy, active, done_after)."""
  logits = mask_logits(logits, allowed)
  token = sample_token(logits, key, temperature=settings.temperature, top_k=settings.top_k,
                       top_p=settings.top_p)
  scale = settings.temperature or 1.0
  logp = token_logprobs(logits, token, temperature=scale)
  entropy = token_entropy(logits.astype(jnp.float32) / scale)
  if settings.pause_entropy is not None:
    done = done | (may_pause & (entropy >= settings.pause_entropy))
  active = ~done
  token = jnp.where(active, token, settings.pad_id)
  done = done | (active & jnp.isin(token, jnp.asarray(settings.stop_tokens or (-1,))))
  return token, jnp.where(active, logp, 0.0), jnp.where(active, entropy, 0.0), active, done


def _assemble(prompts, prompt_valid, steps, done, settings: _Sampling,
              decode_steps) -> SampleOutput:
  tokens, logps, entropies, actives = (jnp.swapaxes(x, 0, 1) for x in steps)
  no_prompt = jnp.zeros(prompts.shape, bool)
  token_valid = jnp.concatenate([prompt_valid, actives], axis=1)
  return SampleOutput(
      tokens=jnp.concatenate([prompts, tokens], axis=1),
      mask=jnp.concatenate([no_prompt, actives], axis=1),
      logprobs=jnp.concatenate([jnp.zeros(prompts.shape), logps], axis=1),
      entropy=jnp.concatenate([jnp.zeros(prompts.shape), entropies], axis=1),
      token_valid=token_valid,
      positions=prompt_positions(token_valid),
      truncated=~done if settings.stop_tokens else jnp.zeros_like(done),
      decode_steps=decode_steps,
  )


def _extend(model, cache: KVCache, logits, length, slot, tokens, token_valid, layers):
  """Writes the left-padded chunk tokens / token_valid [B, W] at cache slots
  [slot, slot + W), each row's positions going on from its `length` [B] tokens.

  Returns (cache, logits [B, V] after each row's last token - the chunk's last
  column, or the given `logits` for a row with no token in the chunk -, length
  + the row's new tokens)."""
  positions = length[:, None] + prompt_positions(token_valid)
  # Only the last column's logits are needed: not the [B, W, V] projection of the chunk.
  out, cache = model.decode(tokens, positions, token_valid, cache, slot, logits=False,
                            layers=layers)
  logits = jnp.where(token_valid[:, -1:], model.logits(out.hidden[:, -1]), logits)
  return cache, logits, length + jnp.sum(token_valid, axis=1)


def _decode(model, cache: KVCache, logits, position, slot, done, key, allowed, hidden,
            settings: _Sampling, layers, budget=None):
  """A `while_loop` of one-token decode steps from `logits` [B, V], writing slots
  slot, slot + 1, ...; rows `done` [B] from the start sample nothing, and a row
  samples at most `budget` [B] tokens (None: max_new_tokens), then is cut off
  (not `done`: truncated).

  The loop ends after `max_new_tokens` steps or, with `stop_when_done`, as
  soon as every row has emitted a stop token or spent its budget. The step outputs live in [N, B]
  buffers pre-filled with what a finished row would write (pad, 0, 0, False),
  so an early stop returns exactly what running all N steps returns. Returns
  (buffers, done, decode steps run, cache, logits after each row's last token,
  position).
  """
  steps, batch = settings.max_new_tokens, done.shape[0]
  buffers = (jnp.full((steps, batch), settings.pad_id, jnp.int32),
             jnp.zeros((steps, batch), jnp.float32), jnp.zeros((steps, batch), jnp.float32),
             jnp.zeros((steps, batch), bool))

  budget = jnp.full(batch, steps) if budget is None else budget

  def unfinished(carry):
    i, done = carry[0], carry[3]
    return (i < steps) & ~(settings.stop_when_done & jnp.all(done | (i >= budget)))

  def step(carry):
    i, cache, logits, done, position, buffers = carry
    spent = i >= budget
    token, logp, entropy, active, ended = _response_step(logits, step_key(key, i), done | spent,
                                                          allowed[i], settings, i > 0)
    done = ended & (done | ~spent)
    fed = jnp.where(hidden[i], settings.hidden_token, token)
    out, cache = model.decode(fed[:, None], position[:, None], active[:, None], cache, slot + i,
                              layers=layers)
    buffers = tuple(b.at[i].set(v.astype(b.dtype))
                    for b, v in zip(buffers, (token, logp, entropy, active)))
    logits = jnp.where(active[:, None], out.logits[:, 0], logits)
    return i + 1, cache, logits, done, position + active, buffers

  init = (jnp.int32(0), cache, logits, done, position, buffers)
  decode_steps, cache, logits, done, position, buffers = jax.lax.while_loop(unfinished, step, init)
  return buffers, done, decode_steps, cache, logits, position


@functools.partial(jax.jit, static_argnums=(0, 7))
def _generate_cached(graphdef, state, prompts, prompt_valid, key, allowed, hidden,
                     settings: _Sampling, budgets=None):
  """Prefill, then the decode loop (`_decode`)."""
  model = nnx.merge(graphdef, state)
  batch, prompt_len = prompts.shape
  slots = model.config.cache_slots(prompt_len + settings.max_new_tokens)
  cache = KVCache.zeros(model.config, batch, slots)
  layers = model.unstacked_layers()  # once, outside the loop
  logits = jnp.zeros((batch, model.config.vocab_size), jnp.float32)
  cache, logits, length = _extend(model, cache, logits, jnp.zeros(batch, jnp.int32), 0, prompts,
                                  prompt_valid, layers)
  buffers, done, decode_steps, *_ = _decode(model, cache, logits, length, prompt_len,
                                            jnp.zeros(batch, bool), key, allowed, hidden,
                                            settings, layers, budgets)
  return _assemble(prompts, prompt_valid, buffers, done, settings, decode_steps)


def generate(
    model: Transformer,
    prompts: Array,
    prompt_valid: Array,
    key: Array,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_tokens: tuple[int, ...] = (),
    pad_id: int = 0,
    padding: str = "left",
    actions: Actions | None = None,
    stop_when_done: bool = True,
    budgets: Array | None = None,
) -> SampleOutput:
  """Samples up to `max_new_tokens` per prompt with a KV cache; deterministic given `key`.

  A row stops after emitting one of `stop_tokens` (that token is part of the response);
  later slots hold `pad_id` with mask False. The behaviour log-probs are those of the
  temperature-scaled distribution before top-k / top-p truncation (module docstring).

  Args:
    model: the policy.
    prompts: ``[B, P]`` int prompt ids.
    prompt_valid: ``[B, P]`` bool, the real prompt tokens (`padding` says which side holds
      the pads).
    key: a PRNG key.
    max_new_tokens: N, the response budget.
    temperature: the sampling temperature; 0 is greedy.
    top_k: keep the k most likely tokens (None: all).
    top_p: keep the smallest set of tokens whose mass reaches top_p (None: all).
    stop_tokens: ids that end a response.
    pad_id: the id written after a row's end.
    padding: "left" or "right", the side of the prompt's pads.
    actions: the allowed tokens (``[P + N, V]`` or per row ``[B, P + N, V]``) and hidden
      columns (``[P + N]`` or ``[B, P + N]``) of the output rows; None allows and shows every
      token.
    stop_when_done: stop decoding once every row has emitted a stop token (the output equals
      the full N-step run's); False always runs N steps, e.g. to time a fixed amount of
      decoding.
    budgets: ``[B]`` int in [1, max_new_tokens], each row's own response budget: a row that
      has sampled that many tokens without a stop token is cut off (truncated). None: every
      row's is max_new_tokens.

  Returns:
    A `SampleOutput`: tokens, mask, logprobs, entropy, token_valid and positions
    ``[B, P + N]``, truncated ``[B]`` and decode_steps.

  Raises:
    ValueError: on mismatched shapes or invalid sampling settings.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxcredit.models import Transformer, preset
    >>> from jaxcredit.sampling import generate
    >>> model = Transformer(preset("tiny", vocab_size=16), rngs=nnx.Rngs(0))
    >>> out = generate(model, jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3), bool),
    ...                jax.random.key(0), max_new_tokens=4)
    >>> out.tokens.shape, out.mask[:, 3:].all().item(), out.mask[:, :3].any().item()
    ((2, 7), True, False)
  """
  graphdef, state, prompts, prompt_valid, allowed, hidden, settings = _prepare(
      model, prompts, prompt_valid, max_new_tokens, temperature, top_k, top_p, stop_tokens, pad_id,
      padding, actions, stop_when_done)
  return _generate_cached(graphdef, state, prompts, prompt_valid, key, allowed, hidden, settings,
                          check_budgets(budgets, prompts.shape[0], max_new_tokens))


def check_budgets(budgets, rows: int, max_new_tokens: int) -> Array | None:
  """Per-row response budgets as ``[rows]`` int32, checked to lie in [1, max_new_tokens].

  Args:
    budgets: ``[rows]`` ints, or None.
    rows: the number of responses.
    max_new_tokens: the largest budget allowed.

  Returns:
    the budgets as an int32 array, or None when `budgets` is None.

  Raises:
    ValueError: on a shape other than ``[rows]`` or a budget outside [1, max_new_tokens].
  """
  if budgets is None:
    return None
  budgets = np.asarray(budgets)
  _checks.check_shape(budgets, (rows,), "budgets")
  if budgets.size and (budgets.min() < 1 or budgets.max() > max_new_tokens):
    raise ValueError(f"budgets must lie in [1, max_new_tokens = {max_new_tokens}], got "
                     f"[{budgets.min()}, {budgets.max()}].")
  return jnp.asarray(budgets, jnp.int32)


def _prepare(model, prompts, prompt_valid, max_new_tokens, temperature, top_k, top_p, stop_tokens,
             pad_id, padding, actions, stop_when_done) -> tuple:
  """`generate`'s arguments checked and laid out for a jitted sampler: (graphdef, state,
  prompts, prompt_valid, allowed, hidden, settings), prompts left-aligned and observed."""
  _check_generate_args(prompts, prompt_valid, max_new_tokens, temperature, top_k, top_p, padding)
  prompts, prompt_valid = jnp.asarray(prompts), jnp.asarray(prompt_valid).astype(bool)
  if padding == "right":
    prompts, prompt_valid = left_align(prompts, prompt_valid)
  (batch, prompt_len), vocab = prompts.shape, model.config.vocab_size
  actions = Actions() if actions is None else actions
  allowed, hidden = _response_tables(actions, batch, prompt_len, max_new_tokens, vocab)
  prompts = actions.columns(0, prompt_len).observe(prompts)
  settings = _Sampling(max_new_tokens, float(temperature), top_k, top_p,
                       tuple(int(t) for t in stop_tokens), int(pad_id), int(actions.hidden_token),
                       bool(stop_when_done))
  graphdef, state = nnx.split(model)
  return graphdef, state, prompts, prompt_valid, allowed, hidden, settings


def _response_tables(actions: Actions, batch: int, prompt_len: int, steps: int, vocab: int):
  """Step-major tables of the response columns: allowed [N, V] or [N, B, V], hidden [N] or
  [N, B]."""
  width = prompt_len + steps
  allowed = (jnp.ones((width, vocab), bool) if actions.allowed is None
             else jnp.asarray(actions.allowed, bool))
  if allowed.ndim == 1:  # one set for every column
    _checks.check_shape(allowed, (vocab,), "actions.allowed")
    allowed = jnp.broadcast_to(allowed, (width, vocab))
  hidden = jnp.zeros(width, bool) if actions.hidden is None else jnp.asarray(actions.hidden, bool)
  per_row = allowed.ndim == 3
  _checks.check_shape(allowed, (batch, width, vocab) if per_row else (width, vocab),
                      "actions.allowed")
  _checks.check_shape(hidden, (batch, width) if hidden.ndim == 2 else (width,), "actions.hidden")
  allowed, hidden = allowed[..., prompt_len:, :], hidden[..., prompt_len:]
  return (jnp.swapaxes(allowed, 0, 1) if per_row else allowed), hidden.T


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
