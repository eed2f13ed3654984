"""Hypothesis strategies for valid `Rollout` batches, reusable in users' own tests.

Shapes come from small sets so that jit caches are reused across examples;
the values come from a drawn seed, so hypothesis shrinks towards small
shapes and simple seeds.
"""

import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from jaxcredit.rollout import Rollout


def make_mask(rng: np.random.Generator, batch: int, length: int, *,
              holes: bool = True) -> np.ndarray:
  """A random action mask: a prompt prefix, a ragged response end, interior holes; possibly
  empty rows.

  Args:
    rng: the NumPy generator.
    batch: B.
    length: T.
    holes: drop about 15% of the response's positions.

  Returns:
    bool ``[B, T]``.
  """
  starts = rng.integers(0, max(length // 3, 0) + 1, batch)
  ends = rng.integers(starts, length + 1)
  positions = np.arange(length)[None]
  mask = (positions >= starts[:, None]) & (positions < ends[:, None])
  if holes:
    mask &= rng.random((batch, length)) > 0.15
  return mask


def make_turn_ids(rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
  """Random non-decreasing turn ids from 0 (a new turn at about 30% of positions).

  Args:
    rng: the NumPy generator.
    batch: B.
    length: T.

  Returns:
    int32 ``[B, T]``.
  """
  return np.cumsum(rng.random((batch, length)) < 0.3, axis=1).astype(np.int32)


def make_rollout(
    rng: np.random.Generator,
    *,
    batch: int,
    length: int,
    group_size: int,
    binary_rewards: bool = True,
    holes: bool = True,
) -> Rollout:
  """A random `Rollout` with every optional field and the extras built-in estimators read.

  Args:
    rng: the NumPy generator.
    batch: B, a multiple of `group_size`.
    length: T.
    group_size: G.
    binary_rewards: 0/1 rewards, else standard normal.
    holes: interior holes in the mask (`make_mask`).

  Returns:
    the `Rollout`.

  Examples:
    >>> import numpy as np
    >>> from jaxcredit.testing import strategies
    >>> rollout = strategies.make_rollout(np.random.default_rng(0), batch=4, length=6,
    ...                                   group_size=2)
    >>> rollout.shape, rollout.group_size
    ((4, 6), 2)
  """
  mask = make_mask(rng, batch, length, holes=holes)
  token = lambda scale=1.0: jnp.asarray(scale * rng.normal(size=(batch, length)), jnp.float32)
  logprobs = jnp.asarray(-rng.exponential(1.0, (batch, length)), jnp.float32)
  rewards = rng.integers(0, 2, batch) if binary_rewards else rng.normal(size=batch)
  probs = np.exp(np.asarray(logprobs))
  return Rollout(
      tokens=jnp.asarray(rng.integers(0, 32, (batch, length)), jnp.int32),
      mask=jnp.asarray(mask),
      rewards=jnp.asarray(rewards, jnp.float32),
      behaviour_logprobs=logprobs,
      old_logprobs=logprobs + token(0.05),
      ref_logprobs=logprobs + token(0.1),
      values=token(),
      token_rewards=token(0.1),
      entropy=jnp.asarray(rng.exponential(1.0, (batch, length)), jnp.float32),
      staleness=jnp.asarray(rng.integers(0, 4, batch), jnp.int32),
      turn_ids=jnp.asarray(make_turn_ids(rng, batch, length)),
      extras={
          "baseline_rewards": jnp.asarray(rng.integers(0, 2, batch), jnp.float32),
          "sum_pi_squared": jnp.asarray(probs**2 + (1 - probs)**2 * rng.random((batch, length)),
                                        jnp.float32),
          "target_logprobs": logprobs + token(0.2),
          "prm_logprobs": logprobs + token(0.2),
          "mc_values": jnp.asarray(rng.random((batch, length)), jnp.float32),
          "mc_evaluated": jnp.asarray(rng.random((batch, length)) < 0.5),
          "oracle_advantages": token(0.3),
          "oracle_values": jnp.asarray(rng.random((batch, length)), jnp.float32),
          # Its own stream: the other fields' draws are those of the rollouts before it existed.
          "shuffle_priorities": jnp.asarray(
              np.random.default_rng([batch, length]).random((batch, length)), jnp.float32),
          "ktae_scores": token(0.5),
          "turn_rewards": token(0.1),
          "turn_anchors": jnp.asarray(rng.integers(0, 3, (batch, length)), jnp.int32),
          "turn_baselines": jnp.asarray(rng.random((batch, length)), jnp.float32),
          # Its own stream too: three reward components per response, 0/1 and continuous.
          "reward_components": jnp.asarray(_components(batch), jnp.float32),
          "role_baselines": jnp.asarray(np.random.default_rng([batch, 4]).random(batch),
                                        jnp.float32),
          "length_weights": jnp.asarray(
              np.random.default_rng([batch, 6]).uniform(0.5, 1.5, batch), jnp.float32),
          **dict(zip(("tree_path", "tree_segments"), map(jnp.asarray, random_tree(
              np.random.default_rng([batch, length, 5]), batch, length, group_size, 3)))),
      },
      group_size=group_size,
  )


def random_tree(rng: np.random.Generator, batch: int, length: int, group_size: int,
                depth: int) -> tuple[np.ndarray, np.ndarray]:
  """A random tree over each group's leaves, in the layout of
  `jaxcredit.estimators.tree_credit`: each level splits every node's rows into at most two
  contiguous children (so a group may hold two trees), the last level into one leaf per row,
  a node's id is
  ``first row * depth + level``, and segment k covers the k-th of `depth` equal shares of the
  T columns.

  Args:
    rng: the NumPy generator.
    batch: B, a multiple of `group_size`.
    length: T.
    group_size: G, the leaves of one prompt.
    depth: S, segments per row.

  Returns:
    ``(path [B, S], segments [B, T])`` int arrays.

  Examples:
    >>> import numpy as np
    >>> from jaxcredit.testing import strategies
    >>> path, segments = strategies.random_tree(np.random.default_rng(0), 4, 6, 4, 2)
    >>> path.shape, segments[0].tolist()
    ((4, 2), [0, 0, 0, 1, 1, 1])
  """
  path = np.zeros((batch, depth), np.int32)
  for start in range(0, batch, group_size):
    blocks = [(start, start + group_size)]
    for level in range(depth):
      children = []
      for low, high in blocks:
        if level == depth - 1:  # the leaves: one row each
          children += [(row, row + 1) for row in range(low, high)]
          continue
        cut = int(rng.integers(low + 1, high + 1))
        children += [(low, cut)] + ([(cut, high)] if cut < high else [])
      for low, high in children:
        path[low:high, level] = low * depth + level
      blocks = children
  segments = np.minimum(np.arange(length) * depth // max(length, 1), depth - 1)
  return path, np.broadcast_to(segments, (batch, length)).astype(np.int32)


def make_episodes(rng: np.random.Generator, *, batch: int, group_size: int, turns: tuple[int, int],
                  action_tokens: tuple[int, int], observation_tokens: tuple[int, int]) -> Rollout:
  """A random multi-turn `Rollout` laid out as `rollout_sources.MultiTurn` lays episodes
  out: a reset observation, then per turn k its action tokens (mask 1) and the observation
  answering them (mask 0), right-padded; turn ids on each turn's actions and its
  observation (-1 on the reset observation and the padding), each turn's reward on its
  last action, the turn index as its anchor; every other field as `make_rollout`'s.

  Args:
    rng: the NumPy generator.
    batch: B, a multiple of `group_size`.
    group_size: G.
    turns: the (fewest, most) turns of an episode.
    action_tokens: the (fewest, most) action tokens of a turn.
    observation_tokens: the (fewest, most) tokens of an observation.

  Returns:
    the `Rollout`, T the longest episode.
  """
  draw = lambda bounds, size=None: rng.integers(bounds[0], bounds[1] + 1, size)
  rows = []
  for _ in range(batch):
    spans = [(False, -1, int(draw(observation_tokens)))]
    for k in range(int(draw(turns))):
      spans += [(True, k, int(draw(action_tokens))), (False, k, int(draw(observation_tokens)))]
    rows.append(spans)
  length = max(sum(n for _, _, n in spans) for spans in rows)
  mask, turn_ids = np.zeros((batch, length), bool), np.full((batch, length), -1, np.int32)
  turn_rewards = np.zeros((batch, length), np.float32)
  for row, spans in enumerate(rows):
    start = 0
    for action, turn, n in spans:
      mask[row, start:start + n], turn_ids[row, start:start + n] = action, turn
      if action:
        turn_rewards[row, start + n - 1] = rng.normal()
      start += n
  base = make_rollout(rng, batch=batch, length=length, group_size=group_size)
  return base.replace(mask=jnp.asarray(mask), turn_ids=jnp.asarray(turn_ids),
                      rewards=jnp.asarray(turn_rewards.sum(axis=1)),
                      extras={**base.extras, "turn_rewards": jnp.asarray(turn_rewards),
                              "turn_anchors": jnp.asarray(np.maximum(turn_ids, 0))})


def _components(batch: int) -> np.ndarray:
  """[B, 3] reward components: two 0/1 ones and a continuous one."""
  rng = np.random.default_rng([batch, 3])
  return np.concatenate([rng.integers(0, 2, (batch, 2)), rng.normal(size=(batch, 1))], axis=1)


@st.composite
def rollouts(
    draw,
    group_sizes=(1, 2, 4),
    batch_sizes=(4, 8),
    lengths=(1, 6, 9),
    binary_rewards: bool | None = None,
) -> Rollout:
  """A hypothesis strategy of valid rollouts: contiguous groups, ragged masks with interior
  holes, empty rows, binary or continuous rewards.

  Args:
    group_sizes: the group sizes drawn.
    batch_sizes: the batch sizes drawn (those that the group size divides).
    lengths: the lengths T drawn.
    binary_rewards: fix the rewards binary (True) or continuous (False); None draws it.

  Returns:
    a strategy of `Rollout`.
  """
  group_size = draw(st.sampled_from(group_sizes))
  batch = draw(st.sampled_from([b for b in batch_sizes if b % group_size == 0] or [group_size]))
  length = draw(st.sampled_from(lengths))
  binary = draw(st.booleans()) if binary_rewards is None else binary_rewards
  seed = draw(st.integers(0, 2**16))
  return make_rollout(
      np.random.default_rng(seed), batch=batch, length=length, group_size=group_size,
      binary_rewards=binary,
  )
