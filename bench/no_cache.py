"""The no-cache baselines the benchmarks time the KV cache against, and the tests' reference
for it: a sampler that re-runs the whole [B, P + N] buffer at every step, and a multi-turn
source that prefills every row's whole context at every turn. Both sample exactly what the
cached ones sample from the same key.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcredit import sampling
from jaxcredit.rollout_sources import MultiTurn
from jaxcredit.rollout_sources.turn_sampler import TurnSampler
from jaxcredit.sampling import sampler


def generate_without_cache(model, prompts, prompt_valid, key, *, max_new_tokens: int,
                           temperature: float = 1.0, top_k: int | None = None,
                           top_p: float | None = None, stop_tokens: tuple[int, ...] = (),
                           pad_id: int = 0, padding: str = "left",
                           actions: sampling.Actions | None = None) -> sampling.SampleOutput:
  """`jaxcredit.sampling.generate` without its KV cache: the same arguments and output."""
  graphdef, state, prompts, prompt_valid, allowed, hidden, settings = sampler._prepare(
      model, prompts, prompt_valid, max_new_tokens, temperature, top_k, top_p, stop_tokens,
      pad_id, padding, actions, stop_when_done=False)
  return _recompute(graphdef, state, prompts, prompt_valid, key, allowed, hidden, settings)


@functools.partial(jax.jit, static_argnums=(0, 7))
def _recompute(graphdef, state, prompts, prompt_valid, key, allowed, hidden, settings):
  """The no-cache baseline: re-runs the whole [B, P + N] buffer every step."""
  model = nnx.merge(graphdef, state)
  batch, prompt_len = prompts.shape
  pad = jnp.zeros((batch, settings.max_new_tokens), prompts.dtype)
  tokens = jnp.concatenate([prompts, pad], axis=1)
  token_valid = jnp.concatenate([prompt_valid, pad.astype(bool)], axis=1)

  def step(carry, i):
    tokens, token_valid, done = carry
    hidden_rows = jnp.concatenate([jnp.zeros((prompt_len, *hidden.shape[1:]), bool), hidden]).T
    inputs = sampling.observed_inputs(tokens, hidden_rows, settings.hidden_token)
    out = model(inputs, positions=sampling.prompt_positions(token_valid), token_valid=token_valid)
    logits = jax.lax.dynamic_index_in_dim(out.logits, prompt_len + i - 1, axis=1, keepdims=False)
    token, logp, entropy, active, done = sampler._response_step(
        logits, jax.random.fold_in(key, i), done, allowed[i], settings)
    tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, prompt_len + i))
    token_valid = jax.lax.dynamic_update_slice(token_valid, active[:, None], (0, prompt_len + i))
    return (tokens, token_valid, done), (token, logp, entropy, active)

  init = (tokens, token_valid, jnp.zeros((batch,), bool))
  (_, _, done), steps = jax.lax.scan(step, init, jnp.arange(settings.max_new_tokens))
  return sampler._assemble(prompts, prompt_valid, steps, done, settings,
                           jnp.int32(settings.max_new_tokens))


class RebuildingTurnSampler(TurnSampler):
  """`TurnSampler` that rebuilds its KV cache from every row's whole context at every turn
  instead of prefilling only what is new."""

  def rebuilds(self, cache, width: int, slots: int, longest: int) -> bool:
    del cache, width, slots, longest
    return True


class RebuildingMultiTurn(MultiTurn):
  """`MultiTurn` whose turns are sampled by a `RebuildingTurnSampler`."""

  @functools.cached_property
  def turn_sampler(self) -> RebuildingTurnSampler:
    kept = super().turn_sampler
    return RebuildingTurnSampler(**{field.name: getattr(kept, field.name)
                                    for field in dataclasses.fields(kept)})
