"""Multi-turn environments: the policy acts in turns, the environment answers in tokens.

  state, observation = env.reset(rng, example)
  state, observation, reward, done = env.step(state, action_tokens)

An environment runs on the host, one episode (one batch row) at a time:
`example` is the dataset example of the row, `rng` a `np.random.Generator`
seeded per row, `action_tokens` the 1-D int array of the ids the policy
emitted in its turn (its turn-end token included, when it emitted one).
Observations are 1-D integer arrays of token ids (possibly empty) that are
appended to the context after the turn, with mask 0: the policy conditions
on them but is not trained on them. `reward` is the turn's reward (a finite
real number; an outcome-only task returns 0 until the last turn); `done`
ends the episode. The state is whatever the environment needs (it is
threaded, so an environment can be pure).

An environment may also define `anchor(state) -> hashable`: the identity of
the state a turn starts from, for estimators that group turns from equal
states (GiGPO). Without it, the turn index and the observation before the
turn stand for the state.

`rollout_sources.MultiTurn` drives a batch of episodes against a model.
"""

from typing import Any, Protocol

import numpy as np


class Environment(Protocol):
  """What `rollout_sources.MultiTurn` drives (module docstring).

  Implementations define ``reset(rng, example) -> (state, observation)`` and
  ``step(state, action_tokens) -> (state, observation, reward, done)``, and may define
  ``anchor(state) -> hashable`` (GiGPO's state identity).
  """

  def reset(self, rng: np.random.Generator, example: Any) -> tuple[Any, np.ndarray]: ...

  def step(self, state: Any, action_tokens: np.ndarray) -> tuple[Any, np.ndarray, float, bool]:
    ...


def as_observation(observation: Any, vocab_size: int, where: str) -> np.ndarray:
  """An environment's observation as token ids, validated.

  Args:
    observation: what the environment returned.
    vocab_size: the policy's vocabulary size.
    where: the caller's name, for the error message.

  Returns:
    int32 ``[n]`` ids in ``[0, vocab_size)``.

  Raises:
    TypeError: when it is not a 1-D array of integer ids (text, floats).
    ValueError: on ids outside the vocabulary.
  """
  array = np.asarray(observation)
  if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
    raise TypeError(
        f"{where} returned an observation that is not a 1-D array of token ids: got "
        f"{type(observation).__name__} with dtype {array.dtype} and shape {array.shape}.")
  if array.size and (array.min() < 0 or array.max() >= vocab_size):
    raise ValueError(f"{where} returned observation ids {array.min()}..{array.max()}, outside the "
                     f"vocabulary [0, {vocab_size}).")
  return array.astype(np.int32)


def as_reward(reward: Any, where: str) -> float:
  """An environment's reward as a finite float, validated.

  Args:
    reward: what the environment returned.
    where: the caller's name, for the error message.

  Returns:
    the reward as a float.

  Raises:
    TypeError: when it is not a real scalar.
    ValueError: when it is not finite.
  """
  array = np.asarray(reward)
  if array.ndim != 0 or array.dtype.kind not in "iuf":
    raise TypeError(f"{where} returned a reward that is not a real number: {reward!r}.")
  value = float(array)
  if not np.isfinite(value):
    raise ValueError(f"{where} returned a non-finite reward {value}.")
  return value
