"""The host-side state of multi-turn episodes (`multi_turn`): their columns, the tree each
prompt's episodes fork in, the KV cache kept between turns and the widths it compiles at."""

import dataclasses
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Episodes", "TurnCache", "TurnTree", "block_width", "packed_width"]


@dataclasses.dataclass
class Episodes:
  """The episode columns of this process's rows, filled on the host turn by turn.

  Attributes:
    tokens: ``[b, E]`` int32 episode tokens (observations and actions), pad after `length`.
    action: ``[b, E]`` whether the policy sampled the token.
    logprobs: ``[b, E]`` float32 the sampler's log-probs of action tokens.
    entropy: ``[b, E]`` float32 the sampler's entropies at action tokens.
    turn_ids: ``[b, E]`` int32 the turn of each action token and of the observation after
      it (-1 before the first action).
    turn_rewards: ``[b, E]`` float32 each turn's reward, on its last action token.
    anchors: ``[b, E]`` int32 an id of the state each turn started from, on its action
      tokens (`multi_turn`'s turn anchors).
    length: ``[b]`` columns used.
    done: ``[b]`` whether the episode ended.
    truncated: ``[b]`` whether it was cut short: its columns or its turns ran out.
    dropped: ``[b]`` tokens that did not fit.
  """

  tokens: np.ndarray
  action: np.ndarray
  logprobs: np.ndarray
  entropy: np.ndarray
  turn_ids: np.ndarray
  turn_rewards: np.ndarray
  anchors: np.ndarray
  length: np.ndarray
  done: np.ndarray
  truncated: np.ndarray
  dropped: np.ndarray

  @classmethod
  def empty(cls, rows: int, columns: int, pad_id: int) -> "Episodes":
    shape = (rows, columns)
    return cls(np.full(shape, pad_id, np.int32), np.zeros(shape, bool),
               np.zeros(shape, np.float32), np.zeros(shape, np.float32),
               np.full(shape, -1, np.int32), np.zeros(shape, np.float32),
               np.zeros(shape, np.int32), np.zeros(rows, np.int64), np.zeros(rows, bool),
               np.zeros(rows, bool), np.zeros(rows, np.int64))

  def take(self, rows: np.ndarray) -> "Episodes":
    """The episodes of `rows` (copies), in that order."""
    return Episodes(**{f.name: getattr(self, f.name)[rows].copy()
                        for f in dataclasses.fields(self)})

  def append(self, row: int, tokens: np.ndarray, turn: int, **values: np.ndarray) -> bool:
    """Writes `tokens` (and per-token `values`: action, logprobs, entropy, anchors) after
    the row's episode; what does not fit is cut (and counted) and the episode ends
    truncated. Returns whether everything fitted."""
    start = self.length[row]
    fits = min(len(tokens), self.tokens.shape[1] - start)
    columns = slice(start, start + fits)
    self.tokens[row, columns] = tokens[:fits]
    self.turn_ids[row, columns] = turn
    for name, value in values.items():
      getattr(self, name)[row, columns] = value[:fits]
    self.length[row] += fits
    if fits < len(tokens):
      self.done[row] = self.truncated[row] = True
      self.dropped[row] += len(tokens) - fits
    return fits == len(tokens)


class TurnTree(NamedTuple):
  """The tree of episodes sampled from each prompt (`multi_turn`'s module docstring).

  Attributes:
    roots: episodes started from the prompt.
    branching: copies of each running episode at a fork.
    depth: forks along each path.
    segment_turns: turns between forks.
  """

  roots: int = 1
  branching: int = 2
  depth: int = 1
  segment_turns: int = 1

  @property
  def leaves(self) -> int:
    """roots * branching^depth episodes per prompt."""
    return self.roots * self.branching**self.depth

  def check(self, max_turns: int) -> "TurnTree":
    """Raises ValueError naming the setting when the forks do not fall within `max_turns`
    turns or a count is not positive; returns self."""
    if min(self.roots, self.branching, self.segment_turns) < 1 or self.depth < 0:
      raise ValueError(f"rollout.tree needs roots, branching, segment_turns >= 1 and "
                       f"depth >= 0, got {self._asdict()}.")
    if self.depth * self.segment_turns >= max_turns:
      raise ValueError(f"rollout.tree forks after {self.depth} x {self.segment_turns} turns, "
                       f"not within the episode's {max_turns} turns: lower depth or "
                       "segment_turns.")
    return self


@dataclasses.dataclass
class TurnCache:
  """The rows' KV cache between turns.

  Attributes:
    contexts: the sampler's contexts (None before the first turn).
    columns: ``[b]`` the episode columns each row's context holds.
    fresh: ``[b]`` whether the row holds another episode's context (a slot that took a new
      episode: its whole context is prefilled into the next block).
  """

  contexts: Any
  columns: np.ndarray  # [b] int
  fresh: np.ndarray  # [b] bool


def block_width(columns: int, most: int) -> int:
  """A block width for new columns, so that a few shapes compile: the next power of two up to
  64, past that `packed_width` (a tool's page of 2,112 tokens takes 2,560 columns, not
  4,096).

  Args:
    columns: the new columns, > 0.
    most: the widest block.

  Returns:
    the width, at most `most`.
  """
  power = 1 << (int(columns) - 1).bit_length()
  return min(power, most) if power <= 64 else packed_width(columns, most)


def packed_width(columns: int, most: int) -> int:
  """The width of a rebuilt cache's contexts: the longest rounded up to an eighth of its power
  of two (at most 1/8 pad; eight shapes per doubling).

  Args:
    columns: the longest context's columns, > 0.
    most: the widest context.

  Returns:
    the width, at most `most`.
  """
  step = max(1, (1 << (int(columns) - 1).bit_length()) // 8)
  return min(-(-int(columns) // step) * step, most)
