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

Multi-turn sampling keeps the cache between calls: `jaxcredit.sampling.contexts`.

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
