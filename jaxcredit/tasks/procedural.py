"""What generated tasks share: their `TrainTask`'s data, generated and prepared as TFDS
array_record files from the task's options, a character tokenizer for text tasks, and the
batched lab's evaluation prompts."""

import hashlib
import itertools
from collections.abc import Callable, Sequence

import numpy as np

from jaxcredit.tasks import builders, loader, rewards, scorers, task
from jaxcredit.tasks.tokenizers import CharTokenizer


def fields(name: str, config, options, *, data_dir: str, seed: int) -> dict:
  """The `TrainTask` fields every generated task shares (name, sources, config,
  truncated_reward).

  Its train and test splits of config.train_size and config.test_size examples are
  generated with `options` from `seed`, built under `data_dir` (or reused) and named by the
  options' digest, so that runs with other options never share files.

  Args:
    name: the task's name.
    config: the run's ``task`` config.
    options: the task's options.
    data_dir: where the dataset is built.
    seed: the data seed.

  Returns:
    the fields, as keyword arguments of `TrainTask`.
  """
  settings = hashlib.sha256(repr(options).encode()).hexdigest()[:12]
  builder = builders.get(name, data_dir=data_dir,
                         config=builders.ProceduralConfig(name=f"run_{settings}", task=options),
                         train_size=config.train_size, test_size=config.test_size, seed=seed)
  builder.download_and_prepare()
  return dict(name=name, sources=builder.as_data_source(), config=options,
              truncated_reward=float(config.get("truncated_reward", 0.0)))


def character_task(name: str, config, options, alphabet: str,
                   reward: Callable[[str, dict], tuple[float, str]], *, data_dir: str,
                   seed: int,
                   components: Callable[[str, dict], Sequence[float]] | None = None
                   ) -> task.TrainTask:
  """A generated text task on a character tokenizer: prompts and responses within
  config.max_prompt_length and config.max_response_length, a response ending at EOS, scored
  by ``reward(response text, example)`` (`scorers.text_scorer`).

  Args:
    name: the task's name.
    config: the run's ``task`` config.
    options: the task's options.
    alphabet: the characters of the tokenizer.
    reward: ``reward(response, example) -> (reward, reason)``.
    data_dir: where the dataset is built.
    seed: the data seed.
    components: ``components(response, example) -> [K]``, the reward's components
      (`scorers.text_components`), or None.

  Returns:
    the `TrainTask`.
  """
  tokenizer = CharTokenizer(alphabet)
  failures = rewards.FailureCount()
  return task.TrainTask(
      vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, stop_tokens=(tokenizer.eos_id,),
      max_prompt_length=config.max_prompt_length,
      max_response_length=config.max_response_length, encode=loader.text_encoder(tokenizer),
      score=scorers.text_scorer(tokenizer, reward, failures), token_texts=tokenizer.token_texts,
      reward_failures=failures,
      score_components=None if components is None else scorers.text_components(tokenizer,
                                                                             components),
      **fields(name, config, options, data_dir=data_dir, seed=seed))


def character_environment_task(name: str, config, options, tokenizer: CharTokenizer,
                               environment, *, turn_end: str, data_dir: str, seed: int,
                               demonstration_actions: Callable | None = None) -> task.TrainTask:
  """A generated multi-turn task on a character tokenizer, its rewards from `environment`
  turn by turn (`scorers.environment_rewards`), its turns ended by `turn_end`.

  Args:
    name: the task's name.
    config: the run's ``task`` config.
    options: the task's options, with ``episode_length``, ``max_turns`` and
      ``max_turn_tokens``.
    tokenizer: the character tokenizer of observations and actions.
    environment: the task's environment (`rollout_sources.environment.Environment`).
    turn_end: the character that ends a turn.
    data_dir: where the dataset is built.
    seed: the data seed.
    demonstration_actions: ``completion ids [n] -> bool [n]``, a demonstration's policy
      tokens (SFT), or None (RL only).

  Returns:
    the `TrainTask`.
  """
  return task.TrainTask(
      vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, stop_tokens=(),
      max_prompt_length=config.max_prompt_length, max_response_length=options.episode_length,
      encode=loader.text_encoder(tokenizer, eos=False), score=scorers.environment_rewards(name),
      token_texts=tokenizer.token_texts, environment=environment, max_turns=options.max_turns,
      max_turn_tokens=options.max_turn_tokens, turn_end_tokens=tuple(tokenizer.encode(turn_end)),
      demonstration_actions=demonstration_actions,
      **fields(name, config, options, data_dir=data_dir, seed=seed))


def key_tuples(n_keys: int, count: int) -> np.ndarray:
  """Every tuple of `count` key indices, in lexicographic order (the first index slowest).

  Args:
    n_keys: |C|.
    count: indices per tuple.

  Returns:
    int32 ``[|C|^count, count]``.

  Examples:
    >>> from jaxcredit.tasks import procedural
    >>> procedural.key_tuples(2, 2).tolist()
    [[0, 0], [0, 1], [1, 0], [1, 1]]
  """
  return np.asarray(list(itertools.product(range(n_keys), repeat=count)),
                    np.int32).reshape(n_keys**count, count)


def evaluation_symbols(n_keys: int, count: int, limit: int) -> np.ndarray:
  """The key symbols of a batched task's evaluation prompts: all ``|C|^count`` combinations
  when that is at most `limit`, else `limit` drawn uniformly (a fixed stream, the same for
  every seed and cell).

  Args:
    n_keys: |C|.
    count: symbols per prompt.
    limit: the most prompts.

  Returns:
    int ``[n, count]`` indices into C.
  """
  if n_keys**count <= limit:
    return key_tuples(n_keys, count)
  return np.random.default_rng(0).integers(0, n_keys, (limit, count))
