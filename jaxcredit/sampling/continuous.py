"""Continuous batching: a fixed number of decode slots, each taking the next response as soon
as its own ends.

A static batch (`sampler.generate`) keeps every row in its slot until the batch's longest
response ends, so on long-tailed response lengths most decode work is spent on finished rows.
`generate_continuous` decodes R = Q x G responses (Q prompts, G samples each) through S <= R
slots, all inside one jitted `while_loop`:

  prefill   each of the Q prompts once (the G samples of a prompt share its prefill);
  admit     a free slot takes the next response in order: its prompt's keys and values,
            logits and length are copied into the slot (its earlier slots made invalid);
  decode    one token for every busy slot, written at that slot's own cache column
            (`Transformer.decode` with a slot per row);
  release   a slot whose response emitted a stop token or spent its budget is free again.

Response r is sampled with its own key (`keys[r]`, folded with its step), so its tokens,
log-probs and entropies are those `generate` draws for the same prompt with the same key
(`generate(..., key=keys)` on the prompts repeated G times): which slot a response occupies,
and what the other slots hold, never enters its computation. The output is the static
batch's `SampleOutput`, rows in prompt-major order (row r = prompt r // G); its
`decode_steps` counts the loop's steps, each one decode step of the S slots.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import Array

from jaxcredit.models.transformer import KVCache, Transformer
from jaxcredit.sampling.actions import Actions
from jaxcredit.sampling.draw import step_key
from jaxcredit.sampling.sampler import (SampleOutput, _assemble, _extend, _prepare,
                                        _response_step, _Sampling, check_budgets)


class _Slots(NamedTuple):
  """The decode loop's state: S slots and the [N, R] output buffers."""

  cache: KVCache  # [n_layers, S, P + N, ...]
  logits: Array  # [S, V] after each slot's last token
  position: Array  # [S] the next RoPE position
  step: Array  # [S] tokens the slot's response has sampled
  response: Array  # [S] the response a slot decodes, -1 when free
  admitted: Array  # [] responses admitted so far
  decode_steps: Array  # []
  buffers: tuple  # tokens, log-probs, entropies, sampled: [N, R] each
  stopped: Array  # [R] emitted a stop token


def response_keys(key: Array, responses: int) -> Array:
  """The ``[responses]`` keys `generate_continuous` draws response r with (``keys[r]``).

  Args:
    key: a PRNG key.
    responses: R, the number of responses.

  Returns:
    ``[R]`` keys, `jax.random.split(key, R)`.
  """
  return jax.random.split(key, responses)


def generate_continuous(
    model: Transformer,
    prompts: Array,
    prompt_valid: Array,
    key: Array,
    *,
    slots: int,
    max_new_tokens: int,
    group_size: int = 1,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_tokens: tuple[int, ...] = (),
    pad_id: int = 0,
    padding: str = "left",
    actions: Actions | None = None,
    budgets: Array | None = None,
) -> SampleOutput:
  """Samples `group_size` responses per prompt through `slots` continuously refilled slots.

  Each slot decodes one response at a time and takes the next as soon as its response ends
  (module docstring), so the decode work follows the responses' total length rather than
  the longest one's times the batch.

  Args:
    model: the policy.
    prompts: ``[Q, P]`` int prompt ids.
    prompt_valid: ``[Q, P]`` bool, the real prompt tokens.
    key: a PRNG key (response r is drawn with ``response_keys(key, R)[r]``), or ``[R]`` keys,
      one per response.
    slots: S, the responses decoded at once (1 <= S <= R = Q x group_size).
    max_new_tokens: N, the response budget.
    group_size: G, the responses per prompt.
    temperature: the sampling temperature; 0 is greedy.
    top_k: keep the k most likely tokens (None: all).
    top_p: keep the smallest set of tokens whose mass reaches top_p (None: all).
    stop_tokens: ids that end a response.
    pad_id: the id written after a response's end.
    padding: "left" or "right", the side of the prompts' pads.
    actions: the allowed tokens (``[P + N, V]`` or ``[V]``) and hidden columns (``[P + N]``)
      of the output columns, as `generate` takes them (per-row tables are refused).
    budgets: ``[R]`` int in [1, N], each response's own budget (None: N).

  Returns:
    A `SampleOutput` of R rows, prompt-major: tokens, mask, logprobs, entropy, token_valid and
    positions ``[R, P + N]``, truncated ``[R]``; decode_steps counts decode steps of the S
    slots.

  Raises:
    ValueError: on mismatched shapes, invalid sampling settings, a slot count outside [1, R],
      or per-row action tables.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxcredit.models import Transformer, preset
    >>> from jaxcredit.sampling import continuous, generate
    >>> model = Transformer(preset("tiny", vocab_size=16), rngs=nnx.Rngs(0))
    >>> prompts, valid = jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3), bool)
    >>> out = continuous.generate_continuous(model, prompts, valid, jax.random.key(0), slots=2,
    ...                                      group_size=2, max_new_tokens=4, stop_tokens=(3,))
    >>> static = generate(model, jnp.repeat(prompts, 2, 0), jnp.repeat(valid, 2, 0),
    ...                   continuous.response_keys(jax.random.key(0), 4), max_new_tokens=4,
    ...                   stop_tokens=(3,))
    >>> bool((out.tokens == static.tokens).all()), out.tokens.shape
    (True, (4, 7))
  """
  if not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f"group_size must be a positive int, got {group_size!r}.")
  responses = jnp.shape(prompts)[0] * group_size if jnp.ndim(prompts) == 2 else 0
  if not isinstance(slots, int) or not 1 <= slots <= max(responses, 1):
    raise ValueError(f"slots must be an int in [1, prompts x group_size = {responses}], got "
                     f"{slots!r}.")
  keys = response_keys(key, responses) if jnp.ndim(key) == 0 else jnp.asarray(key)
  if keys.shape != (responses,):
    raise ValueError(f"key must be one key or [R = {responses}] keys, got shape "
                     f"{list(keys.shape)}.")
  graphdef, state, prompts, prompt_valid, allowed, hidden, settings = _prepare(
      model, prompts, prompt_valid, max_new_tokens, temperature, top_k, top_p, stop_tokens, pad_id,
      padding, _check_column_actions(actions), True)
  budgets = check_budgets(budgets, responses, max_new_tokens)
  budgets = jnp.full(responses, max_new_tokens, jnp.int32) if budgets is None else budgets
  return _generate(graphdef, state, prompts, prompt_valid, keys, allowed, hidden, budgets,
                   settings, slots, group_size)


def _check_column_actions(actions: Actions | None) -> Actions | None:
  """`actions`, refused when its tables are per response rather than per column."""
  if actions is not None and ((actions.allowed is not None and jnp.ndim(actions.allowed) == 3)
                              or (actions.hidden is not None and jnp.ndim(actions.hidden) == 2)):
    raise ValueError("generate_continuous takes actions per column ([P + N, V] or [V] allowed, "
                     "[P + N] hidden), not per response.")
  return actions


@functools.partial(jax.jit, static_argnums=(0, 8, 9, 10))
def _generate(graphdef, state, prompts, prompt_valid, keys, allowed, hidden, budgets,
              settings: _Sampling, slots: int, group_size: int) -> SampleOutput:
  model = nnx.merge(graphdef, state)
  layers = model.unstacked_layers()
  (n_prompts, prompt_len), steps = prompts.shape, settings.max_new_tokens
  responses, vocab = keys.shape[0], model.config.vocab_size
  # Every prompt prefilled once; its G responses copy its keys and values into their slots.
  bank, bank_logits, bank_length = _extend(
      model, KVCache.zeros(model.config, n_prompts, prompt_len),
      jnp.zeros((n_prompts, vocab), jnp.float32), jnp.zeros(n_prompts, jnp.int32), 0, prompts,
      prompt_valid, layers)
  free_columns = jnp.zeros((slots, steps), bool)

  def admit(carry: _Slots) -> _Slots:
    free = carry.response < 0
    candidate = carry.admitted + jnp.cumsum(free) - 1
    take = free & (candidate < responses)
    prompt = jnp.where(take, candidate, 0) // group_size
    copied = bank.rows(prompt)
    row = lambda x: take.reshape((1, slots) + (1,) * (x.ndim - 2))
    keys_, values = (jnp.where(row(x), new, x[:, :, :prompt_len])
                     for x, new in ((carry.cache.keys, copied.keys),
                                    (carry.cache.values, copied.values)))
    cache = KVCache(carry.cache.keys.at[:, :, :prompt_len].set(keys_),
                    carry.cache.values.at[:, :, :prompt_len].set(values),
                    jnp.where(take[:, None],
                              jnp.concatenate([copied.key_valid, free_columns], 1),
                              carry.cache.key_valid))
    return carry._replace(
        cache=cache, logits=jnp.where(take[:, None], bank_logits[prompt], carry.logits),
        position=jnp.where(take, bank_length[prompt], carry.position),
        step=jnp.where(take, 0, carry.step),
        response=jnp.where(take, candidate, carry.response),
        admitted=carry.admitted + jnp.sum(take))

  def unfinished(carry: _Slots):
    return (carry.admitted < responses) | jnp.any(carry.response >= 0)

  def decode(carry: _Slots) -> _Slots:
    carry = jax.lax.cond(jnp.any(carry.response < 0) & (carry.admitted < responses), admit,
                         lambda c: c, carry)
    busy = carry.response >= 0
    response = jnp.maximum(carry.response, 0)
    column = jnp.minimum(carry.step, steps - 1)
    slot_allowed, slot_hidden = allowed[column], hidden[column]
    token, logp, entropy, active, ended = _response_step(
        carry.logits, step_key(keys[response], carry.step), ~busy, slot_allowed, settings)
    stopped = active & ended
    finished = stopped | (active & (carry.step + 1 >= budgets[response]))
    written = jnp.where(active, response, responses)  # out of range: dropped
    buffers = tuple(b.at[column, written].set(v.astype(b.dtype), mode="drop")
                    for b, v in zip(carry.buffers, (token, logp, entropy, active)))
    fed = jnp.where(slot_hidden, settings.hidden_token, token)
    out, cache = model.decode(fed[:, None], carry.position[:, None], active[:, None],
                              carry.cache, prompt_len + column, layers=layers)
    return carry._replace(
        cache=cache, logits=jnp.where(active[:, None], out.logits[:, 0], carry.logits),
        position=carry.position + active, step=carry.step + active,
        response=jnp.where(finished, -1, carry.response), decode_steps=carry.decode_steps + 1,
        buffers=buffers, stopped=carry.stopped.at[written].set(stopped, mode="drop"))

  init = _Slots(
      cache=KVCache.zeros(model.config, slots, prompt_len + steps),
      logits=jnp.zeros((slots, vocab), jnp.float32), position=jnp.zeros(slots, jnp.int32),
      step=jnp.zeros(slots, jnp.int32), response=jnp.full(slots, -1, jnp.int32),
      admitted=jnp.int32(0), decode_steps=jnp.int32(0),
      buffers=(jnp.full((steps, responses), settings.pad_id, jnp.int32),
               jnp.zeros((steps, responses), jnp.float32),
               jnp.zeros((steps, responses), jnp.float32), jnp.zeros((steps, responses), bool)),
      stopped=jnp.zeros(responses, bool))
  final = jax.lax.while_loop(unfinished, decode, init)
  repeat = lambda x: jnp.repeat(x, group_size, axis=0)
  return _assemble(repeat(prompts), repeat(prompt_valid), final.buffers, final.stopped, settings,
                   final.decode_steps)
