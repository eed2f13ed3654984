"""One turn of every running episode, sampled after its whole context, with the rows' KV cache
kept from turn to turn (`multi_turn.MultiTurn` plays episodes with it).

The KV cache lives across turns (`sampling.Contexts`): a turn prefills only what is new in
each row - the observation since its last action - into a block of slots shared by the batch
(`block_width` columns: the most any row adds, rounded up to a power of two, past 64 to an
eighth of one; left-padded), then decodes the turn. The rows' blocks leave pad slots behind
(the shorter rows' observations and turns). The cache holds P + E + max_turn_tokens slots and
`cache_headroom` (a quarter) of P + E more (rounded up to whole attention blocks,
`TransformerConfig.cache_slots`); when the next block and turn would not fit, it is rebuilt
from the rows' whole contexts, packed (`packed_width` columns). So a turn's cost does not grow
with the turns before it beyond attention's own: rows that add the same number of columns
each turn leave no pads and never rebuild, and otherwise a rebuild comes only after pads have
filled the headroom.
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxcredit.rollout_sources.episodes import Episodes, TurnCache, block_width, packed_width
from jaxcredit.sampling import (Actions, clear_contexts, continue_contexts, extend_contexts,
                                start_contexts)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TurnSampler:
  """Samples a turn for every row not done (module docstring); `MultiTurn` makes it from its
  own settings.

  Attributes:
    max_turn_tokens: action tokens sampled per turn at most.
    max_episode_tokens: context columns after the prompt (observations and actions), E.
    turn_end_tokens: ids that end a turn (kept in it).
    temperature: the sampling temperature.
    pad_id: the padding id.
    place: this process's rows -> the global batch-sharded array.
    local: its inverse.
    actions: the `sampling.Actions` (one allowed set ``[V]``, hidden columns
      ``[P + E]``).
    cache_headroom: the cache's slots beyond P + E + max_turn_tokens, as a fraction of
      P + E.
    slots: episodes played at once (`MultiTurn.slots`), or None.
  """

  max_turn_tokens: int
  max_episode_tokens: int
  turn_end_tokens: tuple[int, ...]
  temperature: float
  pad_id: int
  place: Callable[[np.ndarray], Array]
  local: Callable[[Array], np.ndarray]
  actions: Actions
  cache_headroom: float
  slots: int | None

  def sample(self, model, prompts, prompt_valid, episodes: Episodes, cache: TurnCache,
             key) -> dict:
    """One turn for every row not done, after its context (prompt and episode so far):
    the episode columns not in the cache yet are prefilled first, or the cache is
    rebuilt from the whole contexts (module docstring). Updates `cache`.

    Args:
      model: the policy.
      prompts: ``[b, P]`` this process's left-padded prompts.
      prompt_valid: ``[b, P]`` bool, their real tokens.
      episodes: the rows' `Episodes` so far.
      cache: the rows' `TurnCache`, grown or rebuilt in place.
      key: the turn's PRNG key (or ``[b]`` keys, one per row).

    Returns:
      host arrays of the sampled turn: "tokens", "mask", "logprobs", "entropy" ``[b,
      max_turn_tokens]`` and "truncated" ``[b]``.
    """
    rows, prompt_width = len(prompts), prompts.shape[1]
    most = prompt_width + self.max_episode_tokens
    slots = model.config.cache_slots(most + self.max_turn_tokens,
                                     headroom=int(most * self.cache_headroom))
    fresh = cache.fresh & ~episodes.done
    fed_prompts = self._fed(prompts, 0)
    whole = lambda row: np.concatenate([fed_prompts[row, prompt_valid[row]], self._fed(
        episodes.tokens[row, :episodes.length[row]], prompt_width)])
    new = np.where(episodes.done, 0, np.where(fresh, prompt_valid.sum(axis=1) + episodes.length,
                                              episodes.length - cache.columns))
    most_new = self._global_max(new)  # every process builds the same shapes
    width = (block_width(most_new, most if fresh.any() else self.max_episode_tokens)
             if most_new else 0)
    longest = self._global_max(np.where(episodes.done, 0, prompt_valid.sum(axis=1)
                                        + episodes.length))
    if self.rebuilds(cache, width, slots, longest):
      contexts = [whole(row) for row in range(rows)]
      width = packed_width(self._global_max([len(ids) for ids in contexts]), most)
      cache.contexts = start_contexts(model, *self._left_padded(contexts, width), slots=slots)
    elif width:
      if fresh.any():
        cache.contexts = clear_contexts(cache.contexts, self.place(fresh))
      chunks = [whole(row) if fresh[row] else self._fed(
          episodes.tokens[row, cache.columns[row]:cache.columns[row] + new[row]],
          prompt_width + cache.columns[row]) for row in range(rows)]
      cache.contexts = extend_contexts(model, cache.contexts, *self._left_padded(chunks, width))
    cache.columns[:], cache.fresh[:] = episodes.length, False
    out, cache.contexts = continue_contexts(
        model, cache.contexts, key, max_new_tokens=self.max_turn_tokens,
        done=self.place(episodes.done), temperature=self.temperature,
        stop_tokens=self.turn_end_tokens, pad_id=self.pad_id, allowed=self.actions.allowed,
        hidden=self._hidden_steps(prompt_width + episodes.length),
        hidden_token=self.actions.hidden_token)
    return {"tokens": self.local(out.tokens), "mask": self.local(out.mask).astype(bool),
            "logprobs": self.local(out.logprobs), "entropy": self.local(out.entropy),
            "truncated": self.local(out.truncated)}

  def rebuilds(self, cache: TurnCache, width: int, slots: int, longest: int) -> bool:
    """Whether the turn rebuilds the cache from the whole contexts: there is none yet, the
    next `width` columns of observations and the turn would not fit in its `slots`, or, with
    episode slots, the written slots are more than twice the `longest` context a row will
    hold (the columns of ended episodes are dead: attention would keep reading them)."""
    if cache.contexts is None:
      return True
    written = int(cache.contexts.slot) + width
    return (written + self.max_turn_tokens > slots
            or (self.slots is not None and written > 2 * longest))

  @functools.cached_property
  def hidden(self) -> np.ndarray | None:
    """`actions.hidden` on the host (read every turn), or None."""
    return None if self.actions.hidden is None else np.asarray(self.actions.hidden, bool)

  def _fed(self, tokens: np.ndarray, first_column: int) -> np.ndarray:
    """What the model is fed for `tokens` placed from row column `first_column` on (the last
    axis): `actions.hidden_token` at hidden columns."""
    if self.hidden is None:
      return tokens
    hidden = self.hidden[first_column:first_column + tokens.shape[-1]]
    return np.where(hidden, self.actions.hidden_token, tokens).astype(tokens.dtype)

  def _hidden_steps(self, next_columns: np.ndarray):
    """[b, max_turn_tokens] whether each decode step's token is hidden (its row column:
    `next_columns` [b] onwards), placed; None without hidden columns."""
    hidden = self.hidden
    if hidden is None:
      return None
    columns = next_columns[:, None] + np.arange(self.max_turn_tokens)
    steps = np.where(columns < len(hidden), hidden[np.minimum(columns, len(hidden) - 1)], False)
    return self.place(steps)

  def _global_max(self, values) -> int:
    """The largest of `values` [b] over every process's rows."""
    if jax.process_count() == 1:
      return int(np.max(values))
    return int(jnp.max(self.place(np.asarray(values, np.int32))))

  def _left_padded(self, rows: list[np.ndarray], width: int) -> tuple[Array, Array]:
    """(tokens, valid) [B, width] with each row's ids at the end, placed."""
    tokens = np.full((len(rows), width), self.pad_id, np.int32)
    valid = np.zeros((len(rows), width), bool)
    for row, ids in enumerate(rows):
      if len(ids):
        tokens[row, -len(ids):], valid[row, -len(ids):] = ids, True
    return self.place(tokens), self.place(valid)
