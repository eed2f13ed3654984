"""What training needs from a task, and the registry that names every task.

  task = tasks.make(config.task, data_dir=..., seed=0)   # the run's TrainTask
  task.sources["train"], task.encode            # for tasks.loader.Loader
  task.score(tokens [B, N], mask [B, N], examples) -> [B] float rewards
  task.score_rows(tokens [B, P + N], mask, examples)  # + the truncation rule
  task.actions                                 # typed actions, filler-blind (sampling.Actions)
  task.token_texts(ids) -> list[str]           # each token alone, readable (exports, viewer)
  task.environment                             # multi-turn: what rollout_sources.MultiTurn drives

A task is one module of `jaxcredit.tasks` that ends with one `register(Task(...))`: its name,
the dataclass of its options and how it binds to data for training (`Task.train`). Rows are
laid out as the sampler lays them out: a prompt left-padded to `max_prompt_length`, then
`max_response_length` response slots.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxcredit.registry import Registry
from jaxcredit.rollout_sources import MultiTurn, Scorer
from jaxcredit.sampling import Actions
from jaxcredit.tasks import loader, rewards

@dataclasses.dataclass(frozen=True)
class TrainTask:
  """A task bound to its data, as the training loop uses it.

  A response cut off by the budget (stop tokens exist and none was emitted) is scored
  `truncated_reward` by `score_rows`, whatever the verifier would say of its text:
  ``#### 12`` cut from ``#### 125`` must not pass for a complete answer of 12.

  Attributes:
    name: the task's name.
    vocab_size: the tokenizer's ids.
    pad_id: the padding id.
    stop_tokens: ids that end a response.
    max_prompt_length: P, prompts are left-padded to it.
    max_response_length: N, response columns (a multi-turn episode's columns after the
      prompt).
    sources: ``{split: random-access examples}``.
    encode: ``encode(example) -> (prompt_ids, completion_ids)``.
    score: ``score(tokens [B, N], mask [B, N], examples) -> [B]`` rewards in [0, 1].
    actions: `sampling.Actions` over the ``[P + N]`` columns of a row: the tokens allowed
      at each response step and the steps fed back to the model as its `hidden_token`.
    config: the task's own options (e.g. a `KeyTokenConfig`).
    truncated_reward: the reward of a response cut off by the budget.
    pretrained_vocab: a pretrained tokenizer, whose ids the model's own (padded) vocabulary
      covers; False: the model is built with exactly vocab_size ids.
    token_texts: each token id on its own as readable text.
    environment: a multi-turn task's `Environment`, or None.
    max_turns: turns per episode (multi-turn).
    max_turn_tokens: action tokens per turn (multi-turn).
    turn_end_tokens: tokens that end a turn early (multi-turn).
    reward_failures: responses whose reward function raised (scored 0), counted for the
      loop to report.
    demonstration_actions: a multi-turn task's ``completion ids [n] -> bool [n]``, its
      policy tokens (SFT trains on those only), or None.
  """

  name: str
  vocab_size: int
  pad_id: int
  stop_tokens: tuple[int, ...]
  max_prompt_length: int
  max_response_length: int
  sources: dict
  encode: loader.Encoder
  score: Scorer
  actions: Actions = Actions()
  config: Any = None  # the task's own config (e.g. key_token.KeyTokenConfig)
  truncated_reward: float = 0.0
  # True: a pretrained tokenizer, whose ids the model's own (padded) vocabulary covers;
  # False: the model is built with exactly vocab_size ids.
  pretrained_vocab: bool = False
  # Each token id on its own as readable text (Tokenizer.token_texts; key_token's names).
  token_texts: Callable[[Sequence[int]], list[str]] = lambda ids: [str(int(i)) for i in ids]
  # Multi-turn tasks: the `rollout_sources.environment.Environment` that rewards episodes (then
  # max_response_length is the episode's columns after the prompt), turns per episode,
  # action tokens per turn and the tokens that end a turn early.
  environment: Any = None
  max_turns: int = 0
  max_turn_tokens: int = 0
  turn_end_tokens: tuple[int, ...] = ()
  # Responses whose reward function raised (scored 0), counted for the loop to report.
  reward_failures: rewards.FailureCount = dataclasses.field(default_factory=rewards.FailureCount)
  # Multi-turn tasks: [n] completion ids of a demonstration -> [n] bool, its policy tokens
  # (not the environment's observations); SFT trains on those only.
  demonstration_actions: Callable[[np.ndarray], np.ndarray] | None = None
  # Tasks whose reward has components (e.g. correctness and format): [B, N] response ids,
  # their mask and examples -> [B, K] (what GDPO normalises one by one).
  score_components: Callable[[np.ndarray, np.ndarray, Sequence[dict]], np.ndarray] | None = None

  def sft_loss_mask(self, tokens: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """[B, L] loss_mask of SFT rows, restricted to the policy's tokens of multi-turn
    demonstrations (unchanged for single-turn tasks)."""
    if self.demonstration_actions is None:
      return loss_mask
    restricted = np.zeros_like(loss_mask)
    for row, (ids, completion) in enumerate(zip(tokens, loss_mask)):
      columns = np.flatnonzero(completion)
      restricted[row, columns] = self.demonstration_actions(ids[columns])
    return restricted

  def truncated(self, tokens, mask) -> np.ndarray:
    """[B] bool: whole [B, P + N] rows whose response holds no stop token
    (all False for tasks without stop tokens: their responses have a fixed length)."""
    response = slice(self.max_prompt_length, None)
    in_response = np.asarray(mask, bool)[:, response]
    stopped = np.isin(np.asarray(tokens)[:, response], self.stop_tokens) & in_response
    return ~stopped.any(axis=1) if self.stop_tokens else np.zeros(len(stopped), bool)

  def component_rows(self, tokens, mask, examples: Sequence[dict]) -> np.ndarray:
    """[B, K] reward components of whole [B, P + N] rows (`score_components` of the
    response), 0 where the response was cut off by the budget; ValueError for a task
    without components."""
    if self.score_components is None:
      raise ValueError(f"Task {self.name!r} has no reward components (its TrainTask's "
                       "score_components is None).")
    response = slice(self.max_prompt_length, None)
    components = np.asarray(self.score_components(
        np.asarray(tokens)[:, response], np.asarray(mask)[:, response], examples), np.float32)
    return np.where(self.truncated(tokens, mask)[:, None], np.float32(0.0), components)

  def score_rows(self, tokens, mask, examples: Sequence[dict]) -> np.ndarray:
    """[B] rewards of whole [B, P + N] rows: `score` of the response (after the
    prompt columns), `truncated_reward` where it was cut off by the budget."""
    response = slice(self.max_prompt_length, None)
    scores = self.score(np.asarray(tokens)[:, response], np.asarray(mask)[:, response], examples)
    return np.where(self.truncated(tokens, mask), np.float32(self.truncated_reward), scores)


@dataclasses.dataclass(frozen=True)
class Task:
  """A task as jaxcredit knows it, registered under `name` (`register`).

  Each field after `options` is None where the task lacks it.

  Attributes:
    name: the registered name.
    options: the dataclass of the task's own settings (a run's ``task.options`` are its
      fields, `options_of`).
    data: its TFDS builder class (`builders.get`).
    train: ``(config.task, *, data_dir, seed, tokenizer) -> TrainTask``, the task bound to
      its data for the training loop.
    traceable: ``(options, eval_prompts) ->`` its pure, traceable form for the batched lab
      (`jaxcredit.lab.batched`: prompts, rewards, exact values and credit inside one jit).
    oracle: its exact oracle for training runs, an object (a module) with
      ``no_exact_oracle(options) -> str | None`` (why these options have none),
      ``exact_extras(model, options, rollout, examples) -> (extras, metrics)`` (the exact
      "oracle_advantages" and "oracle_values" of a rollout) and
      ``held_out_success(model, options, examples) -> [n]`` (each held-out prompt's exact
      V(x)).
  """

  name: str
  options: type | None
  data: type | None = None
  train: Callable[..., TrainTask] | None = None
  traceable: Callable | None = None
  oracle: Any = None


_TASKS: Registry = Registry("task")


def register(task: Task, *, overwrite: bool = False) -> Task:
  """Registers a task under its name.

  Args:
    task: the `Task`.
    overwrite: replace a task registered under the same name.

  Returns:
    `task`.

  Raises:
    ValueError: when the name is taken and `overwrite` is False.
  """
  _TASKS.register(task.name, overwrite=overwrite)(task)
  return task


def unregister(name: str) -> None:
  """Removes a registered task (e.g. a test's temporary registration).

  Args:
    name: the task's name.

  Raises:
    ValueError: when no task has that name.
  """
  _TASKS.unregister(name)


def get(name: str) -> Task:
  """The task registered under a name.

  Args:
    name: the task's name.

  Returns:
    the `Task`.

  Raises:
    ValueError: listing the known names when none is registered under it.

  Examples:
    >>> from jaxcredit import tasks
    >>> tasks.get("key_token").oracle is not None
    True
  """
  return _TASKS.get(name)


def names(having: str | None = None) -> list[str]:
  """The registered tasks' names.

  Args:
    having: a `Task` field ("data", "train", "traceable", "oracle"): only the tasks that
      have it; None for all.

  Returns:
    the names, sorted.

  Examples:
    >>> from jaxcredit import tasks
    >>> "arithmetic" in tasks.names("train")
    True
  """
  return [name for name in _TASKS.names()
          if having is None or getattr(_TASKS.get(name), having) is not None]


def make(config, *, data_dir: str, seed: int, tokenizer: str | None = None) -> TrainTask:
  """A training task bound to its data (built under `data_dir`, or reused).

  Args:
    config: the run's ``task`` config: name, options (the task's own fields), train_size,
      test_size, max_prompt_length, max_response_length (tasks whose options fix them ignore
      them), truncated_reward, and the task's own fields (e.g. gsm8k's jsonl_dir).
    data_dir: where TFDS datasets are built.
    seed: the data seed.
    tokenizer: a Hugging Face tokenizer directory, for tasks on a pretrained vocabulary.

  Returns:
    the `TrainTask`.

  Raises:
    ValueError: for an unknown task, or one that runs in the batched lab only.
  """
  task = get(config.name)
  if task.train is None:
    raise ValueError(f"Task {task.name!r} runs in the batched lab only; the training loop takes: "
                     f"{', '.join(names('train'))}.")
  return task.train(config, data_dir=data_dir, seed=seed, tokenizer=tokenizer)


def of_options(options) -> Task:
  """The registered task whose options dataclass an object is an instance of.

  Args:
    options: a task's options (e.g. a `KeyTokenConfig`).

  Returns:
    the `Task`.

  Raises:
    ValueError: naming the registered tasks when none matches.
  """
  for task in map(get, names("options")):
    if isinstance(options, task.options):
      return task
  raise ValueError(f"{type(options).__name__} is the options of no registered task; "
                   f"registered: {', '.join(names())}.")


def options_of(config_class, config):
  """A task's options from a run's config: ``config_class(**config.options)``.

  Args:
    config_class: the task's options dataclass.
    config: the run's ``task`` config.

  Returns:
    the options.

  Raises:
    ValueError: naming task.options and the fields it takes when an option is unknown.
  """
  options = dict(config.get("options") or {})
  known = {field.name for field in dataclasses.fields(config_class)}
  unknown = sorted(set(options) - known)
  if unknown:
    raise ValueError(f"task.options has {', '.join(map(repr, unknown))}, which "
                     f"{config_class.__name__} does not take; it takes: "
                     f"{', '.join(sorted(known))}.")
  return config_class(**options)


def within_tokenizer(task: TrainTask, model_vocab_size: int) -> TrainTask:
  """A task with its actions restricted to its tokenizer's ids when the model's embedding has
  more rows (a padded vocabulary, e.g. Qwen2.5's 151,936 rows for 151,665 tokens): the policy
  never samples, and its log-probs never count, an id the tokenizer lacks.

  Args:
    task: the `TrainTask`.
    model_vocab_size: the model's embedding rows.

  Returns:
    the `TrainTask`, unchanged when no restriction is needed or it has its own.
  """
  if model_vocab_size <= task.vocab_size or task.actions.allowed is not None:
    return task
  ids = np.arange(model_vocab_size) < task.vocab_size
  return dataclasses.replace(task, actions=task.actions._replace(allowed=ids))


def multi_turn_source(task: TrainTask, *, group_size: int = 1, temperature: float = 1.0,
                      place: Callable = jnp.asarray, local: Callable = np.asarray,
                      tree=None, slots: int | None = None) -> MultiTurn:
  """The rollout source of a task with an environment.

  Args:
    task: the `TrainTask`.
    group_size: episodes per prompt.
    temperature: the sampling temperature.
    place: puts host arrays on the devices (e.g. sharded).
    local: reads device arrays back to the host.
    tree: a `rollout_sources.TurnTree` of each prompt's episodes, or None.
    slots: episodes played at once (`MultiTurn.slots`), or None for every row at once.

  Returns:
    a `rollout_sources.MultiTurn`.

  Raises:
    ValueError: for a task without an environment.
  """
  if task.environment is None:
    raise ValueError(f"Task {task.name!r} has no environment: it is not multi-turn.")
  return MultiTurn(task.environment, max_turns=task.max_turns,
                   max_turn_tokens=task.max_turn_tokens,
                   max_episode_tokens=task.max_response_length,
                   turn_end_tokens=task.turn_end_tokens, group_size=group_size,
                   temperature=temperature, pad_id=task.pad_id, place=place, local=local,
                   tree=tree, actions=task.actions, slots=slots)
