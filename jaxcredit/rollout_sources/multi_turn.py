"""Multi-turn rollouts: the policy and an environment take turns in one context.

A row is the task prompt, then the episode: the reset observation, and per
turn k the policy's action tokens (sampled after the whole context so far,
until a turn-end token or `max_turn_tokens`) followed by the environment's
observation of them:

  [prompt, left-padded to P] [obs_0] [actions_0] [obs_1] [actions_1] [obs_2] ... [pad]
  mask        0                 0        1           0         1         0
  turn_ids   -1                -1        0           0         1         1

Observation tokens are in the sequence with mask 0, so every estimator
carries returns and values across them as across any masked position, and
the learner conditions on them without training on them. The episode lives
in `max_episode_tokens` columns after the prompt, right-padded.

What the Rollout carries beyond a single-turn one:
  turn_ids                 [B, T] int  the turn of each action and of the observation
                                       answering it; -1 on the prompt, the reset
                                       observation and padding.
  rewards                  [B]         the sum of the turn rewards.
  truncated                [B] bool    the episode did not end (`done`) within
                                       max_turns, or ran out of context columns.
  extras["dropped_tokens"] [B] int32   tokens that did not fit in the context columns:
                                       the rest of the observation or turn that
                                       overflowed them (the episode ends there).
  extras["turn_rewards"]   [B, T]      each turn's reward on its last action token.
  extras["turn_anchors"]   [B, T] int32 an id of the state the turn started from, on
                                       its action tokens: `env.anchor(state)` when the
                                       environment defines it, else the turn index and
                                       the observation before the turn (GiGPO's anchor
                                       states).
  extras["turns"]          [B] int32   turns taken.
  extras["cut_turns"]      [B] int32   turns cut by max_turn_tokens before a
                                       turn-end token (the environment still
                                       steps on what was emitted).
  extras["env_seeds"]      [B] uint32  the seed of each row's env.reset generator:
                                       with the recorded actions it replays the
                                       environment to any turn (`returns_to_go`).
An episode cut by the context is still scored: its reward is the sum of the
turn rewards it received. Nothing is dropped silently: cuts are counted.

With a `TurnTree`, a prompt's group is a tree of episodes whose nodes are whole turns
(Tree-GRPO's agent steps): `roots` episodes start from the prompt, and after every
`segment_turns` turns each running episode is copied `branching` times - its context's KV
cache rows, its environment state (a deep copy) and its record - `depth` times; the
rollout then carries the tree as `sampling.sample_tree`'s do (extras["tree_path"] and
["tree_segments"], a segment being the turns between two forks, with the observations
answering them).

The KV cache lives across turns (`turn_sampler.TurnSampler`): a turn prefills only what is
new in each row, and the cache is rebuilt, packed, only when the next turn would not fit.

With `slots` (continuous batching of episodes), S rows of the cache play the batch's episodes
S at a time: when an episode ends, its row is emptied (`sampling.clear_contexts`) and takes
the next episode in row order, whose prompt and reset observation are prefilled in the same
block as the other rows' new observations; the rollout's rows stay in batch order. Episode r
samples its turn k with ``fold_in(response_keys(key, B)[r], k)``, so its episode does not
depend on the slot it is played in, on the episodes before it there, or on S. Episodes that
run many more turns than the others then no longer keep finished rows decoding beside them.
"""

import copy
import dataclasses
import functools
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxcredit.rollout import Rollout
from jaxcredit.sampling import Actions, TreeSpec, prompt_positions
from jaxcredit.sampling.continuous import response_keys
from jaxcredit.sampling.draw import step_key
from jaxcredit.sampling import tree as sampling_tree
from jaxcredit.rollout_sources.environment import Environment, as_observation, as_reward
from jaxcredit.rollout_sources.episodes import Episodes, TurnCache, TurnTree
from jaxcredit.rollout_sources.turn_sampler import TurnSampler


@dataclasses.dataclass(frozen=True)
class MultiTurn:
  """Drives `env` against the model for up to `max_turns` turns per row (module docstring).

  Attributes:
    env: the `rollout_sources.environment.Environment`, run per row on the host.
    max_turns: turns per episode; an episode not done after them is truncated.
    max_turn_tokens: action tokens sampled per turn at most.
    max_episode_tokens: context columns after the prompt (observations and actions).
    turn_end_tokens: ids that end a turn (kept in it); () makes every turn exactly
      max_turn_tokens long.
    place: this process's rows -> the global batch-sharded array (identity on one process).
    local: its inverse.
    tree: a `TurnTree`: each prompt's `group_size` episodes are its leaves; None for
      independent episodes.
    actions: the `sampling.Actions` the learner applies too: one allowed set ``[V]`` for every
      action, and hidden columns ``[P + max_episode_tokens]`` (a token there is recorded as
      sampled or observed but fed to the model as ``actions.hidden_token``).
    cache_headroom: the KV cache's slots beyond P + E + max_turn_tokens, as a fraction of
      P + E, that pad slots may fill before the cache is rebuilt (`turn_sampler`).
    slots: episodes played at once, each taking the next episode when its own ends (module
      docstring); None plays every row at once.
  """

  env: Environment
  max_turns: int
  max_turn_tokens: int
  max_episode_tokens: int
  turn_end_tokens: tuple[int, ...] = ()
  group_size: int = 1
  temperature: float = 1.0
  pad_id: int = 0
  place: Callable[[np.ndarray], Array] = jnp.asarray
  local: Callable[[Array], np.ndarray] = np.asarray
  tree: TurnTree | None = None
  actions: Actions = Actions()
  cache_headroom: float = 0.25
  slots: int | None = None

  def __post_init__(self):
    for name in ("max_turns", "max_turn_tokens", "max_episode_tokens", "slots"):
      value = getattr(self, name)
      if not (name == "slots" and value is None) and (not isinstance(value, int) or value < 1):
        raise ValueError(f"MultiTurn.{name} must be a positive int, got {value!r}.")
    if self.slots is not None and self.tree is not None:
      raise ValueError("MultiTurn plays a tree's episodes together (they fork from each "
                       "other): set slots = None or tree = None.")
    if not self.cache_headroom >= 0:
      raise ValueError(f"MultiTurn.cache_headroom must be >= 0, got {self.cache_headroom!r}.")
    if self.actions.allowed is not None and np.ndim(self.actions.allowed) != 1:
      raise ValueError("MultiTurn takes one allowed set [V] for every action, got shape "
                       f"{list(np.shape(self.actions.allowed))}.")
    if self.actions.hidden is not None and np.ndim(self.actions.hidden) != 1:
      raise ValueError("MultiTurn takes hidden columns as one [P + max_episode_tokens] vector, "
                       f"got shape {list(np.shape(self.actions.hidden))}.")
    if self.tree is not None:
      self.tree.check(self.max_turns)
      if self.tree.leaves != self.group_size:
        raise ValueError(f"rollout.tree has {self.tree.leaves} leaves per prompt, but the group "
                         f"is {self.group_size} episodes: set rl.group_size = "
                         f"{self.tree.leaves}.")

  def __call__(self, model, batch: Mapping[str, Any], key: Array) -> Rollout:
    prompts, prompt_valid = np.asarray(batch["prompts"]), np.asarray(batch["prompt_valid"], bool)
    examples, vocab = batch["examples"], model.config.vocab_size
    hidden = self.turn_sampler.hidden
    if hidden is not None and len(hidden) != prompts.shape[1] + self.max_episode_tokens:
      raise ValueError(f"MultiTurn: actions.hidden has {len(hidden)} columns, the rows "
                       f"{prompts.shape[1]} prompt + {self.max_episode_tokens} episode columns.")
    reset_key, key = jax.random.split(key)
    seeds = self.local(jax.random.bits(reset_key, (self.place(prompts).shape[0],), jnp.uint32))
    # A tree starts its roots from each group's first row; independent episodes, every row.
    starts = (np.arange(len(prompts)) if self.tree is None else
              np.repeat(np.arange(0, len(prompts), self.group_size), self.tree.roots))
    rows = len(starts)
    prompts, prompt_valid, seeds = prompts[starts], prompt_valid[starts], seeds[starts]
    episodes = Episodes.empty(rows, self.max_episode_tokens, self.pad_id)
    states, observations = [], []
    for row in range(rows):
      state, observation = self.env.reset(np.random.default_rng(int(seeds[row])),
                                          examples[starts[row]])
      states.append(state)
      observations.append(as_observation(observation, vocab, f"{_name(self.env)}.reset"))
      episodes.append(row, observations[row], -1)
    if self.slots is not None:
      totals = self._play_slots(model, prompts, prompt_valid, episodes, states, observations, key)
      return self._rollout(prompts, prompt_valid, episodes, *totals, seeds)
    if self.tree is None:
      rewards, turns, cut, _ = self._play(model, prompts, prompt_valid, episodes, states,
                                          observations, np.zeros(rows, np.int64), key)
      return self._rollout(prompts, prompt_valid, episodes, rewards, turns, cut, seeds)
    return self._play_tree(model, prompts, prompt_valid, episodes, states, observations, seeds,
                           key)

  def _play_tree(self, model, prompts, prompt_valid, episodes: Episodes, states: list,
                 observations: list, seeds, key: Array) -> Rollout:
    """Plays each segment of `segment_turns` turns, then copies every row `branching` times
    (cache rows, environment state, record), `depth` times (module docstring)."""
    tree, rows = self.tree, len(prompts)
    totals = [np.zeros(rows, np.float32), np.zeros(rows, np.int32), np.zeros(rows, np.int32)]
    cache, forks = None, []  # forks: each row's episode columns at each fork
    for level in range(tree.depth + 1):
      played = level * tree.segment_turns
      turns = tree.segment_turns if level < tree.depth else self.max_turns - played
      *segment, cache = self._play(model, prompts, prompt_valid, episodes, states, observations,
                                   np.full(len(prompts), played), jax.random.fold_in(key, level),
                                   cache=cache, turns_to_play=turns)
      totals = [total + part for total, part in zip(totals, segment)]
      if level < tree.depth:
        parents = np.repeat(np.arange(len(prompts)), tree.branching)
        forks = [f[parents] for f in forks] + [episodes.length[parents].copy()]
        episodes = episodes.take(parents)
        states = [copy.deepcopy(states[row]) for row in parents]
        observations = [observations[row] for row in parents]
        prompts, prompt_valid, seeds = prompts[parents], prompt_valid[parents], seeds[parents]
        totals = [total[parents] for total in totals]
        cache = TurnCache(None if cache.contexts is None else sampling_tree.fork(
            cache.contexts, jnp.asarray(parents)), cache.columns[parents], cache.fresh[parents])
    rollout = self._rollout(prompts, prompt_valid, episodes, *totals, seeds)
    columns = np.arange(self.max_episode_tokens)[None]
    level = sum((columns >= f[:, None]).astype(np.int32) for f in forks) + np.zeros_like(columns)
    level = np.where(columns < episodes.length[:, None], level, -1)
    segments = np.concatenate([np.full(prompts.shape, -1, np.int32), level], axis=1)
    spec = TreeSpec(roots=tree.roots, branching=tree.branching, depth=tree.depth)
    return rollout.replace(extras={**rollout.extras,
                                   "tree_path": self.place(sampling_tree.node_ids(spec, rows=len(
                                       prompts))),
                                   "tree_segments": self.place(segments.astype(np.int32))})

  def _play(self, model, prompts, prompt_valid, episodes: Episodes, states: list,
            observations: list, first_turn: np.ndarray, key: Array, *,
            cache: TurnCache | None = None, turns_to_play: int | None = None):
    """Plays every row's episode on from turn first_turn[row] (its context: the prompt and
    the episode columns so far; states and observations: the environment's) until done,
    out of turns or out of columns, or for `turns_to_play` turns. Returns (rewards received,
    turns taken, turns cut, the rows' KV cache: `cache` grown, or a new one)."""
    rows = len(prompts)
    totals = (np.zeros(rows, np.float32), np.zeros(rows, np.int32), np.zeros(rows, np.int32))
    cache = cache or TurnCache(None, np.zeros(rows, np.int64), np.zeros(rows, bool))
    for step in range(turns_to_play or self.max_turns):
      if episodes.done.all():
        break
      sample = self.turn_sampler.sample(model, prompts, prompt_valid, episodes, cache,
                                        jax.random.fold_in(key, step))
      for row in np.flatnonzero(~episodes.done):
        cache.columns[row] = self._take_turn(model, episodes, row, int(first_turn[row]) + step,
                                             sample, row, states, observations, totals)
    return *totals, cache

  def _play_slots(self, model, prompts, prompt_valid, episodes: Episodes, states: list,
                  observations: list, key: Array):
    """Plays every row's episode from its reset, `slots` rows of the cache at a time: a
    row whose episode ends takes the next one (module docstring). Returns (rewards
    received, turns taken, turns cut)."""
    if jax.process_count() > 1:
      raise ValueError("MultiTurn.slots plays one process's episodes: set slots = None to "
                       "play episodes over several processes.")
    rows = len(prompts)
    keys = response_keys(key, rows)
    totals = (np.zeros(rows, np.float32), np.zeros(rows, np.int32), np.zeros(rows, np.int32))
    held = np.full(min(self.slots, rows), -1)  # the episode in each slot; -1: none
    cache = TurnCache(None, np.zeros(len(held), np.int64), np.zeros(len(held), bool))
    waiting = 0
    while True:
      for slot in np.flatnonzero((held < 0) | episodes.done[np.maximum(held, 0)]):
        held[slot] = -1
        while held[slot] < 0 and waiting < rows:
          if not episodes.done[waiting]:  # a reset observation can overflow the columns
            held[slot], cache.fresh[slot] = waiting, True
          waiting += 1
      if (held < 0).all():
        return totals
      playing = np.maximum(held, 0)
      view = episodes.take(playing)
      view.done |= held < 0
      turn_keys = step_key(keys[playing], jnp.asarray(totals[1][playing]))
      sample = self.turn_sampler.sample(model, prompts[playing], prompt_valid[playing], view,
                                        cache, turn_keys)
      for slot in np.flatnonzero(held >= 0):
        row = held[slot]
        cache.columns[slot] = self._take_turn(model, episodes, row, int(totals[1][row]), sample,
                                              slot, states, observations, totals)

  def _take_turn(self, model, episodes: Episodes, row: int, turn: int, sample: dict,
                 index: int, states: list, observations: list, totals) -> int:
    """Records turn `turn` of episode `row` (sampled as `sample` row `index`): its actions,
    then the environment's step on them, adding to `totals` (rewards, turns, cut) and ending
    the episode when done or out of turns. Returns the episode's columns up to its actions
    (what the sampled row's cache holds of it)."""
    rewards, turns, cut = totals
    taken = sample["mask"][index]
    actions = sample["tokens"][index, taken]
    turns[row] += 1
    anchor = np.full(len(actions), self._anchor(states[row], observations[row], turn))
    if not episodes.append(row, actions, turn, action=np.ones(len(actions), bool),
                           logprobs=sample["logprobs"][index, taken],
                           entropy=sample["entropy"][index, taken], anchors=anchor):
      return episodes.length[row]  # the context is full: the episode ends, scored as it stands
    in_cache = episodes.length[row]
    cut[row] += sample["truncated"][index]
    where = f"{_name(self.env)}.step (turn {turn})"
    states[row], observation, reward, done = self.env.step(states[row], actions)
    reward = as_reward(reward, where)
    episodes.turn_rewards[row, episodes.length[row] - 1] = reward
    rewards[row] += reward
    observations[row] = as_observation(observation, model.config.vocab_size, where)
    episodes.append(row, observations[row], turn)
    if done:
      episodes.done[row] = True
    elif turn + 1 >= self.max_turns:  # out of turns
      episodes.done[row] = episodes.truncated[row] = True
    return in_cache

  def returns_to_go(self, model, rollout: Rollout, examples, *, samples: int,
                    key: Array) -> tuple[np.ndarray, int]:
    """(baselines [B, T], actions generated): at each turn's first action token, the mean
    reward from that turn on of `samples` continuations branched from the turn's start
    (the same context; the environment's state replayed from the row's reset seed and
    its earlier turns), 0 elsewhere. It depends only on the history before the turn, so
    R_(>=k) - baseline_k has expectation 0 given that history."""
    tokens, valid = np.asarray(rollout.tokens), np.asarray(rollout.token_valid, bool)
    mask, turn_ids = np.asarray(rollout.mask, bool), np.asarray(rollout.turn_ids)
    seeds = np.asarray(rollout.extra("env_seeds", by="returns_to_go", per="sequence"))
    prompt_width = tokens.shape[1] - self.max_episode_tokens
    vocab = model.config.vocab_size
    branches = []  # (row, first action column, state, observation, turn)
    for row in range(len(tokens)):
      state, observation = self.env.reset(np.random.default_rng(int(seeds[row])), examples[row])
      for turn in range(turn_ids[row].max() + 1):
        in_turn = turn_ids[row] == turn
        columns = np.flatnonzero(mask[row] & in_turn)
        if not len(columns):
          break
        branches += [(row, columns[0], state, observation, turn)] * samples
        state, observation, _, _ = self.env.step(copy.deepcopy(state), tokens[row, columns])
        observation = as_observation(observation, vocab, f"{_name(self.env)}.step (replay)")
        recorded = tokens[row, valid[row] & ~mask[row] & in_turn]
        if not np.array_equal(observation[:len(recorded)], recorded):
          raise ValueError(
              f"{_name(self.env)} replayed turn {turn} of row {row} to another observation "
              f"than it gave while sampling ({observation.tolist()} vs {recorded.tolist()}): "
              "per-turn baselines need step() to be a function of the state and the actions.")
    episodes = Episodes.empty(len(branches), self.max_episode_tokens, self.pad_id)
    for i, (row, start, *_) in enumerate(branches):
      history = tokens[row, prompt_width:start]
      episodes.tokens[i, :len(history)], episodes.length[i] = history, len(history)
    rows = [b[0] for b in branches]
    rewards, *_ = self._play(model, tokens[rows, :prompt_width], valid[rows, :prompt_width],
                               episodes, [copy.deepcopy(b[2]) for b in branches],
                               [b[3] for b in branches], np.asarray([b[4] for b in branches]), key)
    baselines = np.zeros(tokens.shape, np.float32)
    for i in range(0, len(branches), samples):
      row, start = branches[i][:2]
      baselines[row, start] = rewards[i:i + samples].mean()
    generated = int(episodes.action.sum())
    return baselines, generated

  def _anchor(self, state, observation: np.ndarray, turn: int) -> int:
    """A 31-bit id of the state a turn starts from (module docstring)."""
    anchor = getattr(self.env, "anchor", None)
    key = repr(anchor(state)) if anchor else f"{turn}:{observation.tolist()}"
    return zlib.crc32(key.encode()) & 0x7FFFFFFF

  @functools.cached_property
  def turn_sampler(self) -> TurnSampler:
    """The `TurnSampler` of this source's settings: it samples every turn."""
    return TurnSampler(max_turn_tokens=self.max_turn_tokens,
                       max_episode_tokens=self.max_episode_tokens,
                       turn_end_tokens=self.turn_end_tokens, temperature=self.temperature,
                       pad_id=self.pad_id, place=self.place, local=self.local,
                       actions=self.actions, cache_headroom=self.cache_headroom,
                       slots=self.slots)

  def _rollout(self, prompts, prompt_valid, episodes: Episodes, rewards, turns, cut,
               seeds) -> Rollout:
    columns = np.arange(self.max_episode_tokens)[None]
    token_valid = np.concatenate([prompt_valid, columns < episodes.length[:, None]], axis=1)
    before = lambda fill, dtype: np.full(prompts.shape, fill, dtype)
    joined = lambda fill, episode: np.concatenate([before(fill, episode.dtype), episode], axis=1)
    place = self.place
    return Rollout(
        tokens=place(np.concatenate([prompts.astype(np.int32), episodes.tokens], axis=1)),
        mask=place(joined(False, episodes.action)),
        rewards=place(rewards),
        behaviour_logprobs=place(joined(0.0, episodes.logprobs)),
        entropy=place(joined(0.0, episodes.entropy)),
        truncated=place(episodes.truncated),
        positions=prompt_positions(place(token_valid)),
        token_valid=place(token_valid),
        turn_ids=place(joined(-1, episodes.turn_ids)),
        extras={"turn_rewards": place(joined(0.0, episodes.turn_rewards)),
                "turn_anchors": place(joined(0, episodes.anchors)),
                "turns": place(turns), "cut_turns": place(cut),
                "dropped_tokens": place(episodes.dropped.astype(np.int32)),
                "env_seeds": place(np.asarray(seeds, np.uint32))},
        group_size=self.group_size,
    )


def _name(env) -> str:
  return type(env).__name__
