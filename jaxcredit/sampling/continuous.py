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
  release   a slot whose response emitted a stop token or spent its budget is free again;
  drain     once every response is admitted and at most a quarter of the slots are busy, the
            busy ones move into a cache of a quarter the rows, and so on down to one: the
            last responses of a long tail do not decode S rows a step.

Response r is sampled with its own key (`keys[r]`, folded with its step), so its tokens,
log-probs and entropies are those `generate` draws for the same prompt with the same key
(`generate(..., key=keys)` on the prompts repeated G times): which slot a response occupies,
and what the other slots hold, never enters its computation. The output is the static
batch's `SampleOutput`, rows in prompt-major order (row r = prompt r // G); its
`decode_steps` counts the loop's steps, each one decode step of the S slots.

Partial rollouts (`generate_partial`): the loop also stops after `decode_limit` steps; the
responses still running (or not yet admitted) come back unfinished, as a `Partial` a later
call resumes, under that call's policy: its prompt and sampled tokens are prefilled again
(the newer policy's keys and values) and sampling goes on from its step with its own key, so
a response resumed under an unchanged policy is the one an uninterrupted run draws. Every
sampled token records the version of the policy that drew it, and its behaviour log-prob is
that policy's.
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
from jaxcredit.sampling.partial_responses import Partial, PartialSample
from jaxcredit.sampling.sampler import (SampleOutput, _assemble, _extend, _prepare,
                                        _response_step, _Sampling, check_budgets,
                                        prompt_positions)


class _Slots(NamedTuple):
  """The decode loop's state: S slots and the [N, R] output buffers."""

  cache: KVCache  # [n_layers, S, C, ...], C >= P + N (`TransformerConfig.cache_slots`)
  logits: Array  # [S, V] after each slot's last token
  position: Array  # [S] the next RoPE position
  step: Array  # [S] tokens the slot's response has sampled
  response: Array  # [S] the response a slot decodes, -1 when free
  admitted: Array  # [] responses admitted so far
  decode_steps: Array  # []
  buffers: tuple  # tokens, log-probs, entropies, sampled, versions: [N, R] each
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
  return _run(model, prompts, prompt_valid, key, None, None, 0, slots=slots,
              max_new_tokens=max_new_tokens, group_size=group_size, temperature=temperature,
              top_k=top_k, top_p=top_p, stop_tokens=stop_tokens, pad_id=pad_id,
              padding=padding, actions=actions, budgets=budgets).output


def generate_partial(
    model: Transformer,
    prompts: Array,
    prompt_valid: Array,
    key: Array,
    *,
    decode_limit: int,
    resume: Partial | None = None,
    version: int = 0,
    **settings,
) -> PartialSample:
  """`generate_continuous` for at most `decode_limit` decode steps, resuming `resume` first.

  The C responses of `resume` are admitted before the Q x G new ones: each is prefilled again
  under `model` (its prompt and the tokens it sampled) and goes on from its step with its
  key. The responses still running after `decode_limit` steps, or never admitted, come back
  unfinished (`partial_responses.carry_over` gives them as the next call's `resume`). Each
  token sampled here records `version` (the policy's, e.g. its RL step).

  Args:
    model: the policy.
    prompts: ``[Q, P]`` int, the new responses' prompts (Q may be 0 when resuming).
    prompt_valid: ``[Q, P]`` bool.
    key: a PRNG key (new response r is drawn with ``response_keys(key, Q x G)[r]``), or
      ``[Q x G]`` keys.
    decode_limit: the most decode steps this call runs.
    resume: a `Partial` of responses to continue (their ``P + N`` columns must be this
      call's), or None.
    version: the version recorded for every token this call samples.
    **settings: `generate_continuous`'s keyword arguments (slots, max_new_tokens, group_size,
      temperature, top_k, top_p, stop_tokens, pad_id, padding, actions, budgets: the new
      responses').

  Returns:
    A `PartialSample` of C + Q x G rows, the resumed responses first.

  Raises:
    ValueError: as `generate_continuous`, on a decode_limit below 1, or a `resume` of other
      columns.
  """
  if not isinstance(decode_limit, int) or decode_limit < 1:
    raise ValueError(f"decode_limit must be a positive int, got {decode_limit!r}.")
  return _run(model, prompts, prompt_valid, key, resume, decode_limit, version, **settings)


def _run(model, prompts, prompt_valid, key, resume, decode_limit, version, *, slots,
         max_new_tokens, group_size=1, temperature=1.0, top_k=None, top_p=None, stop_tokens=(),
         pad_id=0, padding="left", actions=None, budgets=None) -> PartialSample:
  """Checks the arguments and runs the compiled loop (`_generate`)."""
  if not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f"group_size must be a positive int, got {group_size!r}.")
  fresh = jnp.shape(prompts)[0] * group_size if jnp.ndim(prompts) == 2 else 0
  carried = 0 if resume is None else resume.tokens.shape[0]
  responses = fresh + carried
  if not isinstance(slots, int) or not 1 <= slots <= max(responses, 1):
    raise ValueError(f"slots must be an int in [1, prompts x group_size = {responses}], got "
                     f"{slots!r}.")
  keys = response_keys(key, fresh) if jnp.ndim(key) == 0 else jnp.asarray(key)
  if keys.shape != (fresh,):
    raise ValueError(f"key must be one key or [R = {fresh}] keys, got shape "
                     f"{list(keys.shape)}.")
  graphdef, state, prompts, prompt_valid, allowed, hidden, settings = _prepare(
      model, prompts, prompt_valid, max_new_tokens, temperature, top_k, top_p, stop_tokens, pad_id,
      padding, _check_column_actions(actions), True)
  budgets = check_budgets(budgets, fresh, max_new_tokens)
  budgets = jnp.full(fresh, max_new_tokens, jnp.int32) if budgets is None else budgets
  if resume is not None:
    width = prompts.shape[1] + max_new_tokens
    if resume.tokens.shape[1] != width:
      raise ValueError(f"resume holds rows of {resume.tokens.shape[1]} columns, but this call's "
                       f"are P + N = {width}.")
    keys, budgets = (jnp.concatenate([resume.keys, keys]),
                     jnp.concatenate([jnp.asarray(resume.budgets, jnp.int32), budgets]))
  limit = jnp.iinfo(jnp.int32).max if decode_limit is None else decode_limit
  out, unfinished, versions = _generate(graphdef, state, prompts, prompt_valid, keys, allowed,
                                        hidden, budgets, resume, jnp.int32(limit),
                                        jnp.int32(version), settings, slots, group_size)
  return PartialSample(out, unfinished, versions, keys, budgets)


def _check_column_actions(actions: Actions | None) -> Actions | None:
  """`actions`, refused when its tables are per response rather than per column."""
  if actions is not None and ((actions.allowed is not None and jnp.ndim(actions.allowed) == 3)
                              or (actions.hidden is not None and jnp.ndim(actions.hidden) == 2)):
    raise ValueError("generate_continuous takes actions per column ([P + N, V] or [V] allowed, "
                     "[P + N] hidden), not per response.")
  return actions


def _held(response: Array, where: Array, responses: int) -> Array:
  """``[R]`` bool: the responses that the slots `where` (``[S]`` bool) hold."""
  return jnp.zeros(responses, bool).at[jnp.where(where, response, responses)].set(
      True, mode="drop")


def _compacted(carry: _Slots, width: int, responses: int) -> tuple[_Slots, Array]:
  """`carry` in `width` slots, its busy ones first (in slot order), and the ``[R]`` responses
  of the busy slots that did not fit."""
  busy = carry.response >= 0
  order = jnp.argsort(~busy, stable=True)[:width]
  dropped = _held(carry.response, busy & (jnp.cumsum(busy) > width), responses)
  return carry._replace(cache=carry.cache.rows(order), logits=carry.logits[order],
                        position=carry.position[order], step=carry.step[order],
                        response=carry.response[order]), dropped


def _carried_bank(model, carried: Partial, hidden, settings: _Sampling, prompt_len: int, layers):
  """Resumed rows prefilled under `model`: their cache, the logits after each row's last
  token and its length."""
  rows, width = carried.tokens.shape
  fed = carried.tokens.at[:, prompt_len:].set(  # hidden: [N], one table for every row
      jnp.where(hidden[None], settings.hidden_token, carried.tokens[:, prompt_len:]))
  length = jnp.sum(carried.token_valid, axis=1)
  cache = KVCache.zeros(model.config, rows, model.config.cache_slots(width))
  out, cache = model.decode(fed, prompt_positions(carried.token_valid), carried.token_valid,
                            cache, 0, logits=False, layers=layers)
  last = prompt_len + jnp.sum(carried.mask, axis=1) - 1
  return cache, model.logits(out.hidden[jnp.arange(rows), last]), length


@functools.partial(jax.jit, static_argnums=(0, 11, 12, 13))
def _generate(graphdef, state, prompts, prompt_valid, keys, allowed, hidden, budgets, carried,
              limit, version, settings: _Sampling, slots: int, group_size: int):
  """The loop of the module docstring over the `carried` responses (a `Partial` or None),
  then the new ones; returns (SampleOutput, unfinished [R], versions [R, P + N])."""
  model = nnx.merge(graphdef, state)
  layers = model.unstacked_layers()
  (n_prompts, prompt_len), steps = prompts.shape, settings.max_new_tokens
  responses, vocab = keys.shape[0], model.config.vocab_size
  n_carried = 0 if carried is None else carried.tokens.shape[0]
  # Every prompt prefilled once; its G responses copy its keys and values into their slots.
  if n_prompts:
    bank, bank_logits, bank_length = _extend(
        model, KVCache.zeros(model.config, n_prompts, prompt_len),
        jnp.zeros((n_prompts, vocab), jnp.float32), jnp.zeros(n_prompts, jnp.int32), 0, prompts,
        prompt_valid, layers)
  if n_carried:
    carried_bank, carried_logits, carried_length = _carried_bank(model, carried, hidden,
                                                                 settings, prompt_len, layers)
    carried_steps = jnp.sum(carried.mask, axis=1)
  # Whole attention blocks, so that a decode step reads its key blocks in place.
  columns = model.config.cache_slots(prompt_len + steps)
  row = lambda x, where: where.reshape((1, where.shape[0]) + (1,) * (x.ndim - 2))

  def admit(carry: _Slots) -> _Slots:
    free = carry.response < 0
    candidate = carry.admitted + jnp.cumsum(free) - 1
    take = free & (candidate < responses)
    cache, logits, position, step = carry.cache, carry.logits, carry.position, carry.step
    if n_prompts:  # a new response's prompt; its response columns made invalid
      new = take & (candidate >= n_carried)
      prompt = jnp.where(new, candidate - n_carried, 0) // group_size
      copied = bank.rows(prompt)
      keys_, values = (jnp.where(row(x, new), fresh, x[..., :prompt_len, :])
                       for x, fresh in ((cache.keys, copied.keys), (cache.values, copied.values)))
      free_columns = jnp.zeros((slots, columns - prompt_len), bool)
      cache = KVCache(cache.keys.at[..., :prompt_len, :].set(keys_),
                      cache.values.at[..., :prompt_len, :].set(values),
                      jnp.where(new[:, None],
                                jnp.concatenate([copied.key_valid, free_columns], 1),
                                cache.key_valid))
      logits = jnp.where(new[:, None], bank_logits[prompt], logits)
      position = jnp.where(new, bank_length[prompt], position)
      step = jnp.where(new, 0, step)
    if n_carried:  # a resumed response's whole row: its prompt and what it sampled
      resumed = take & (candidate < n_carried)
      index = jnp.where(resumed, candidate, 0)
      rows = carried_bank.rows(index)
      cache = KVCache(*(jnp.where(row(x, resumed), fresh, x) for x, fresh in (
          (cache.keys, rows.keys), (cache.values, rows.values))),
                      jnp.where(resumed[:, None], rows.key_valid, cache.key_valid))
      logits = jnp.where(resumed[:, None], carried_logits[index], logits)
      position = jnp.where(resumed, carried_length[index], position)
      step = jnp.where(resumed, carried_steps[index], step)
    return carry._replace(cache=cache, logits=logits, position=position, step=step,
                          response=jnp.where(take, candidate, carry.response),
                          admitted=carry.admitted + jnp.sum(take))

  def unfinished(carry: _Slots):
    return (((carry.admitted < responses) | jnp.any(carry.response >= 0))
            & (carry.decode_steps < limit))

  def running(carry: _Slots, narrower: int):
    """Unfinished, and still admitting or with more than `narrower` slots busy."""
    return unfinished(carry) & ((carry.admitted < responses)
                                | (jnp.sum(carry.response >= 0) > narrower))

  def admit_and_decode(carry: _Slots) -> _Slots:
    carry = jax.lax.cond(jnp.any(carry.response < 0) & (carry.admitted < responses), admit,
                         lambda c: c, carry)
    return decode(carry)

  def decode(carry: _Slots) -> _Slots:
    assigned, response = carry.response >= 0, jnp.maximum(carry.response, 0)
    spent = assigned & (carry.step >= budgets[response])  # `carry_over`'s copies
    busy = assigned & ~spent
    column = jnp.minimum(carry.step, steps - 1)
    slot_allowed, slot_hidden = allowed[column], hidden[column]
    token, logp, entropy, active, ended = _response_step(
        carry.logits, step_key(keys[response], carry.step), ~busy, slot_allowed, settings)
    stopped = active & ended
    finished = stopped | (active & (carry.step + 1 >= budgets[response]))
    written = jnp.where(active, response, responses)  # out of range: dropped
    buffers = tuple(b.at[column, written].set(jnp.asarray(v).astype(b.dtype), mode="drop")
                    for b, v in zip(carry.buffers, (token, logp, entropy, active, version)))
    fed = jnp.where(slot_hidden, settings.hidden_token, token)
    out, cache = model.decode(fed[:, None], carry.position[:, None], active[:, None],
                              carry.cache, prompt_len + column, layers=layers)
    return carry._replace(
        cache=cache, logits=jnp.where(active[:, None], out.logits[:, 0], carry.logits),
        position=carry.position + active, step=carry.step + active,
        response=jnp.where(finished | spent, -1, carry.response),
        decode_steps=carry.decode_steps + 1,
        buffers=buffers, stopped=carry.stopped.at[written].set(stopped, mode="drop"))

  fresh = responses - n_carried
  buffers = (jnp.full((steps, fresh), settings.pad_id, jnp.int32),
             jnp.zeros((steps, fresh), jnp.float32), jnp.zeros((steps, fresh), jnp.float32),
             jnp.zeros((steps, fresh), bool), jnp.zeros((steps, fresh), jnp.int32))
  if n_carried:  # what the resumed responses sampled before
    sampled = [jnp.where(carried.mask, x, fill)[:, prompt_len:].T for x, fill in (
        (carried.tokens, settings.pad_id), (carried.logprobs, 0.0), (carried.entropy, 0.0),
        (carried.mask, False), (carried.version, 0))]
    buffers = tuple(jnp.concatenate([old.astype(b.dtype), b], 1)
                    for old, b in zip(sampled, buffers))
  init = _Slots(
      cache=KVCache.zeros(model.config, slots, columns),
      logits=jnp.zeros((slots, vocab), jnp.float32), position=jnp.zeros(slots, jnp.int32),
      step=jnp.zeros(slots, jnp.int32), response=jnp.full(slots, -1, jnp.int32),
      admitted=jnp.int32(0), decode_steps=jnp.int32(0), buffers=buffers,
      stopped=jnp.zeros(responses, bool))
  # Once every response is admitted, the slots drain: when at most a quarter of them are
  # busy, those move into a cache of a quarter the rows and decode on there, and so on.
  widths = [slots]
  while widths[-1] // 4:
    widths.append(widths[-1] // 4)
  final, left = init, jnp.zeros(responses, bool)
  for phase, (width, narrower) in enumerate(zip(widths, widths[1:] + [0])):
    if phase:  # busy slots beyond `width` remain only when the decode limit stopped the loop
      final, cut = _compacted(final, width, responses)
      left |= cut
    final = jax.lax.while_loop(functools.partial(running, narrower=narrower),
                               admit_and_decode if phase == 0 else decode, final)
  rows, row_valid = jnp.repeat(prompts, group_size, 0), jnp.repeat(prompt_valid, group_size, 0)
  if n_carried:
    rows = jnp.concatenate([carried.tokens[:, :prompt_len], rows])
    row_valid = jnp.concatenate([carried.token_valid[:, :prompt_len], row_valid])
  left |= _held(final.response, final.response >= 0, responses)
  left |= jnp.arange(responses) >= final.admitted
  out = _assemble(rows, row_valid, final.buffers[:4], final.stopped, settings,
                  final.decode_steps)
  versions = jnp.concatenate([jnp.zeros((responses, prompt_len), jnp.int32),
                              final.buffers[4].T], 1)
  return out._replace(truncated=out.truncated & ~left), left, versions
