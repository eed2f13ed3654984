"""`key_turns`: multi-turn key_token, where observations reveal what a decisive turn needs.

Token ids are key_token's (V = 32): 0 PAD, 1 BOS, 2 SEP, 3 EOS, 4 FILL, 5-12
keys K0..K7. An episode has `n_turns` turns; before turn k the environment
shows `observation_length` tokens, [key_k, FILL, ..., SEP] when k is decisive
and [FILL, ..., SEP] otherwise; in turn k the policy emits `turn_length`
tokens (no turn-end token: fixed-length turns, so every episode has the same
layout). A decisive turn is right when its first token is key_k. The keys
are drawn uniformly from the first `n_keys` keys, independently per turn,
and a key is shown only just before its turn, so the value of a history
averages over the keys still hidden. ::

  prompt   [BOS, SEP]
  episode  [FILL, SEP] a_0 [key_1, SEP] a_1 [FILL, SEP] a_2 [key_3, SEP] a_3    (n_turns = 4,
                                                                              decisive = 1, 3)

The key is not the last token before the action: a freshly initialised
model with tied embeddings tends to repeat its last input, which would
solve the task without learning anything.
Rewards (rule "all"): 1 at the last turn iff every decisive turn was right,
0 on every other turn. With per_turn_rewards, each right decisive turn pays
1 / |decisive| when it is taken (the sum is the fraction right).

The exact value of every history is computable (`jaxcredit.tasks.key_turns.oracle`):
only the right key continues a decisive turn, so the tree of reachable
histories is small while few turns precede the last decisive one. With
`hidden_actions`, every action token but a decisive turn's first is hidden
from later inputs (recorded, scored and credited, but fed to the policy as
FILL, as key_token's filler_blind does): the policy's view then branches only
at decisive turns, and the oracle stays exact at hundreds of turns.
"""

import dataclasses

import jax
import numpy as np
import tensorflow_datasets as tfds

from jaxcredit import _checks
from jaxcredit.rollout import Rollout
from jaxcredit.rollout_sources import MultiTurn
from jaxcredit.sampling import Actions
from jaxcredit.tasks import builders, loader, procedural, scorers, task
from jaxcredit.tasks.key_token import BOS, FILL, KEY0, PAD, SEP, VOCAB_SIZE, token_names

__all__ = ["KeyTurnsConfig", "KeyTurnsEnv", "MAX_TURNS", "VOCAB_SIZE", "decisive_turns",
           "demonstration_actions", "make_example", "token_names"]

MAX_TURNS = 4096
PLACEMENTS = ("early", "late", "spread")


def decisive_turns(n_turns: int, count: int, placement: str) -> tuple[int, ...]:
  """`count` decisive turns of `n_turns`, placed early (the first turns), late (the last)
  or spread (evenly, the first and the last included).

  Args:
    n_turns: turns per episode.
    count: decisive turns, 1 <= count <= n_turns.
    placement: "early", "late" or "spread".

  Returns:
    the decisive turns, sorted.

  Raises:
    ValueError: on an unknown placement or a count out of range.

  Examples:
    >>> from jaxcredit.tasks.key_turns import decisive_turns
    >>> decisive_turns(256, 3, "spread")
    (0, 128, 255)
  """
  if placement not in PLACEMENTS:
    raise ValueError(f"Unknown placement {placement!r}; expected one of {PLACEMENTS}.")
  if not 1 <= count <= n_turns:
    raise ValueError(f"count must be in [1, {n_turns}], got {count}.")
  if placement == "early":
    return tuple(range(count))
  if placement == "late":
    return tuple(range(n_turns - count, n_turns))
  return tuple(int(t) for t in np.round(np.linspace(0, n_turns - 1, count)))


@dataclasses.dataclass(frozen=True)
class KeyTurnsConfig:
  """The key_turns probe's settings.

  Attributes:
    n_turns: turns per episode.
    decisive: the turns whose first token must be the revealed key.
    n_keys: |C| <= 8.
    turn_length: tokens per turn.
    per_turn_rewards: pay each right decisive turn when it is taken.
    observation_length: tokens the environment shows before each turn (>= 2).
    hidden_actions: feed every action token but a decisive turn's first to the policy as
      FILL (module docstring).
  """

  n_turns: int = 4
  decisive: tuple[int, ...] = (1, 3)
  n_keys: int = 3
  turn_length: int = 1
  per_turn_rewards: bool = False
  observation_length: int = 2
  hidden_actions: bool = False

  def __post_init__(self):
    object.__setattr__(self, "decisive", tuple(sorted(int(k) for k in self.decisive)))
    checks = [
        (1 <= self.n_turns <= MAX_TURNS,
         f"n_turns must be in [1, {MAX_TURNS}], got {self.n_turns}"),
        (len(self.decisive) > 0 and len(set(self.decisive)) == len(self.decisive)
         and all(0 <= k < self.n_turns for k in self.decisive),
         f"decisive must be distinct turns in [0, {self.n_turns}), got {self.decisive}"),
        (2 <= self.n_keys <= 8, f"n_keys must be in [2, 8], got {self.n_keys}"),
        (self.turn_length >= 1, f"turn_length must be >= 1, got {self.turn_length}"),
        (self.observation_length >= 2,
         f"observation_length must be >= 2, got {self.observation_length}"),
    ]
    _checks.require(checks)

  @property
  def keys(self) -> np.ndarray:
    """Token ids of the key alphabet."""
    return np.arange(KEY0, KEY0 + self.n_keys)

  @property
  def turn_width(self) -> int:
    """Columns a turn takes: its observation and its actions."""
    return self.observation_length + self.turn_length

  @property
  def episode_length(self) -> int:
    """Columns an episode takes."""
    return self.n_turns * self.turn_width

  def turn_start(self, turn: int) -> int:
    """The episode column of `turn`'s first action (after its observation)."""
    return turn * self.turn_width + self.observation_length

  def observation(self, turn: int, keys) -> np.ndarray:
    """What the environment shows before `turn` ([] after the last)."""
    if turn >= self.n_turns:
      return np.zeros(0, np.int32)
    shown = np.full(self.observation_length, FILL, np.int32)
    shown[-1] = SEP
    if turn in self.decisive:
      shown[0] = keys[turn]
    return shown

  def action_columns(self, length: int | None = None) -> np.ndarray:
    """bool ``[length]`` (by default ``[episode_length]``): the policy's episode columns."""
    columns = np.arange(self.episode_length if length is None else length)
    return columns % self.turn_width >= self.observation_length

  def hidden_columns(self) -> np.ndarray:
    """bool ``[episode_length]``: the action columns fed as FILL (none without
    hidden_actions)."""
    if not self.hidden_actions:
      return np.zeros(self.episode_length, bool)
    hidden = self.action_columns()
    hidden[[self.turn_start(k) for k in self.decisive]] = False
    return hidden

  def actions(self, prompt_length: int) -> Actions:
    """The `sampling.Actions` of rows of `prompt_length` prompt columns then an episode: the
    hidden columns fed as FILL (`Actions()` without hidden_actions)."""
    if not self.hidden_actions:
      return Actions()
    return Actions(hidden=np.concatenate([np.zeros(prompt_length, bool), self.hidden_columns()]),
                   hidden_token=FILL)


def make_example(rng: np.random.Generator, config: KeyTurnsConfig) -> dict:
  """One key_turns example.

  Args:
    rng: the NumPy generator.
    config: the task's `KeyTurnsConfig`.

  Returns:
    ``{"prompt" [BOS, SEP], "keys" [n_turns] key ids (used at decisive turns),
    "completion" a demonstration episode (observations and right actions) with reward 1}``.
  """
  keys = (KEY0 + rng.integers(0, config.n_keys, config.n_turns)).astype(np.int32)
  episode = []
  for turn in range(config.n_turns):
    episode += [*config.observation(turn, keys), *[keys[turn]] * config.turn_length]
  return {"prompt": np.asarray([BOS, SEP], np.int32), "keys": keys,
          "completion": np.asarray(episode, np.int32)}


def demonstration_actions(completion: np.ndarray, config: KeyTurnsConfig) -> np.ndarray:
  """The policy's tokens of a demonstration episode (not the environment's observations).

  Args:
    completion: the episode's ids.
    config: the task's `KeyTurnsConfig`.

  Returns:
    bool ``[len(completion)]``.
  """
  return config.action_columns(len(completion))


@dataclasses.dataclass(frozen=True)
class _State:
  keys: tuple[int, ...]
  turn: int
  right: int  # decisive turns right so far


@dataclasses.dataclass(frozen=True)
class KeyTurnsEnv:
  """The key_turns environment (`rollout_sources.environment.Environment`); pure: the state is a
  value.

  Attributes:
    config: the task's `KeyTurnsConfig`.
  """

  config: KeyTurnsConfig

  def reset(self, rng: np.random.Generator, example) -> tuple[_State, np.ndarray]:
    del rng  # the keys come with the example
    keys = tuple(int(k) for k in np.asarray(example["keys"]))
    if len(keys) != self.config.n_turns:
      raise ValueError(f"key_turns example has {len(keys)} keys; the config has "
                       f"{self.config.n_turns} turns.")
    return _State(keys, 0, 0), self.config.observation(0, keys)

  def anchor(self, state: _State) -> tuple[int, int, int]:
    """The state a turn starts from, as GiGPO groups it: (turn, its key or FILL,
    decisive turns right so far). Rows of a group share the keys."""
    shown = state.keys[state.turn] if state.turn in self.config.decisive else FILL
    return state.turn, shown, state.right

  def step(self, state: _State, actions: np.ndarray):
    config, turn = self.config, state.turn
    right = turn in config.decisive and len(actions) > 0 and int(actions[0]) == state.keys[turn]
    state = _State(state.keys, turn + 1, state.right + right)
    done = state.turn == config.n_turns
    if config.per_turn_rewards:
      reward = right / len(config.decisive)
    else:
      reward = float(done and state.right == len(config.decisive))
    return state, config.observation(state.turn, state.keys), reward, done


class KeyTurns(builders.ProceduralBuilder):
  """The TFDS builder of key_turns, a multi-turn credit probe (ids, not text)."""

  make_example = staticmethod(make_example)
  FEATURES = {
      "prompt": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "keys": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "completion": tfds.features.Tensor(shape=(None,), dtype=np.int32),
  }
  BUILDER_CONFIGS = [
      builders.ProceduralConfig(name="n4_d2", task=KeyTurnsConfig(),
                                description="4 one-token turns, decisive turns 1 and 3, 3 keys"),
  ]


def train_task(config, *, data_dir: str, seed: int,
               tokenizer: str | None = None) -> task.TrainTask:
  """key_turns bound to its data: a multi-turn task on ids whose rewards come from
  `KeyTurnsEnv`; SFT trains on the policy's turns of a demonstration only.

  Args:
    config: the run's ``task`` config (options, sizes).
    data_dir: where the dataset is built (or reused).
    seed: the data seed.
    tokenizer: unused (the task's tokens are ids).

  Returns:
    the `TrainTask`.

  Raises:
    ValueError: on unknown options.
  """
  del tokenizer
  options = task.options_of(KeyTurnsConfig, config)
  return task.TrainTask(
      actions=options.actions(prompt_length=2),
      vocab_size=VOCAB_SIZE, pad_id=PAD, stop_tokens=(), max_prompt_length=2,
      max_response_length=options.episode_length, encode=loader.ids_encoder,
      score=scorers.environment_rewards("key_turns"), token_texts=token_names,
      environment=KeyTurnsEnv(options), max_turns=options.n_turns,
      max_turn_tokens=options.turn_length,
      demonstration_actions=lambda ids: demonstration_actions(ids, options),
      **procedural.fields("key_turns", config, options, data_dir=data_dir, seed=seed))


def episode_source(config: KeyTurnsConfig) -> MultiTurn:
  """The `rollout_sources.MultiTurn` that samples key_turns episodes (after the 2-token
  prompt) with `config`'s turn, episode and action settings.

  Args:
    config: the task's `KeyTurnsConfig`.

  Returns:
    the `MultiTurn` source.
  """
  return MultiTurn(KeyTurnsEnv(config), max_turns=config.n_turns,
                   max_turn_tokens=config.turn_length, max_episode_tokens=config.episode_length,
                   actions=config.actions(prompt_length=2))


def sample_episodes(model, config: KeyTurnsConfig, rows: int,
                    seed: int) -> tuple[Rollout, list[dict]]:
  """`rows` episodes of `model`: example i drawn with the NumPy seed ``[seed, i]``, the
  episodes sampled by `episode_source` with the JAX key `seed`.

  Args:
    model: the policy (`models.Transformer`).
    config: the task's `KeyTurnsConfig`.
    rows: the number of episodes.
    seed: the seed of the examples and of the sampling.

  Returns:
    ``(rollout, examples)``: the episodes' `Rollout` and their `make_example` dicts.
  """
  examples = [make_example(np.random.default_rng([seed, i]), config) for i in range(rows)]
  batch = {"prompts": np.stack([e["prompt"] for e in examples]),
           "prompt_valid": np.ones((rows, 2), bool), "examples": examples}
  return episode_source(config)(model, batch, jax.random.key(seed)), examples
