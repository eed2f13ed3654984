"""What the training loop needs from a task: data, token ids, rewards, action sets.

  task = tasks.make(config.task, data_dir=..., seed=0)
  task.sources["train"], task.encode            # for tasks.loader.Loader
  task.score(tokens [B, N], mask [B, N], examples) -> [B] float rewards
  task.score_rows(tokens [B, P + N], mask, examples)  # + the truncation rule
  task.actions                                 # typed actions, filler-blind (sampling.Actions)
  task.token_texts(ids) -> list[str]           # each token alone, readable (exports, viewer)
  task.environment                             # multi-turn: what rollout_sources.MultiTurn drives

Rows are laid out as the sampler lays them out: a prompt left-padded to
`max_prompt_length`, then `max_response_length` response slots. Text tasks
(arithmetic, countdown) decode responses with a character tokenizer; gsm8k
with a pretrained checkpoint's tokenizer and chat template; key_token works on
ids, constrains actions per position and can hide filler; target_sum works on
ids, its responses ending at a sampled or forced EOS.
"""

import dataclasses
import hashlib
import pathlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import tensorflow_datasets as tfds

from jaxcredit import _checks
from jaxcredit.models import huggingface
from jaxcredit.rollout_sources import MultiTurn
from jaxcredit.sampling import Actions
from jaxcredit.tasks import (CharTokenizer, HFTokenizer, Tokenizer, arithmetic, builders,
                             calculator, countdown, gsm8k, key_token, key_turns, loader,
                             rewards, target_sum)

Scorer = Callable[[np.ndarray, np.ndarray, Sequence[dict]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class TrainTask:
  """A task bound to its data. `score` maps [B, N] response ids and their
  action mask to [B] rewards in [0, 1]; `actions` (`sampling.Actions` over
  the [P + N] columns of a row) lists the tokens allowed at each response step
  and the steps fed back to the model as its `hidden_token`. A response cut off by the budget
  (stop tokens exist and none was emitted) is scored `truncated_reward` by
  `score_rows`, whatever the verifier would say of its text: `#### 12` cut
  from `#### 125` must not pass for a complete answer of 12."""

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
  # Multi-turn tasks: the `tasks.environment.Environment` that rewards episodes (then
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

  def score_rows(self, tokens, mask, examples: Sequence[dict]) -> np.ndarray:
    """[B] rewards of whole [B, P + N] rows: `score` of the response (after the
    prompt columns), `truncated_reward` where it was cut off by the budget."""
    response = slice(self.max_prompt_length, None)
    scores = self.score(np.asarray(tokens)[:, response], np.asarray(mask)[:, response], examples)
    return np.where(self.truncated(tokens, mask), np.float32(self.truncated_reward), scores)


def task_options(config_class, options: dict):
  """config_class(**options); ValueError naming task.options and the fields it takes when an
  option is unknown."""
  known = {field.name for field in dataclasses.fields(config_class)}
  unknown = sorted(set(options) - known)
  if unknown:
    raise ValueError(f"task.options has {', '.join(map(repr, unknown))}, which "
                     f"{config_class.__name__} does not take; it takes: "
                     f"{', '.join(sorted(known))}.")
  return config_class(**options)


def _text_scorer(tokenizer: Tokenizer, reward_fn: Callable[[str, dict], tuple[float, str]],
                 failures: rewards.FailureCount) -> Scorer:
  """Decoded responses scored by `reward_fn` (`rewards.batched`); responses on which it
  raises score 0 and are counted in `failures`."""
  def score(tokens, mask, examples):
    responses = [tokenizer.decode(row[m]) for row, m in zip(tokens, mask)]
    with warnings.catch_warnings():  # counted instead, and reported by the loop every time
      warnings.simplefilter("ignore", RuntimeWarning)
      scored = rewards.batched(reward_fn, responses, examples)
    failures.add(scored)
    return scored.rewards

  return score


def _arithmetic(options: dict) -> tuple[Any, CharTokenizer, Callable]:
  tokenizer = CharTokenizer(arithmetic.ALPHABET)
  reward = lambda response, example: arithmetic.reward(response, loader.as_text(example["answer"]))
  return task_options(arithmetic.ArithmeticConfig, options), tokenizer, reward


def _countdown(options: dict) -> tuple[Any, CharTokenizer, Callable]:
  task_config = task_options(countdown.CountdownConfig, options)
  tokenizer = CharTokenizer(countdown.ALPHABET)
  reward = lambda response, example: countdown.reward(
      response, example["numbers"], int(example["target"]), format_score=task_config.format_score)
  return task_config, tokenizer, reward


TEXT_TASKS = {"arithmetic": _arithmetic, "countdown": _countdown}
TASKS = (*TEXT_TASKS, "calculator", "key_token", "key_turns", "target_sum", "gsm8k")


def make(config, *, data_dir: str, seed: int, tokenizer: str | None = None) -> TrainTask:
  """Builds (or reuses) the task's TFDS data under `data_dir` and its hooks.

  config: name, options (the task's own config fields), train_size, test_size,
  max_prompt_length, max_response_length (text tasks; key_token's and target_sum's
  are fixed by their configs: K + 2 and T, 5 and n + 1), truncated_reward (default 0:
  the reward of a response cut off by max_response_length). gsm8k reads its own fields
  (`gsm8k_task`) and the Hugging Face tokenizer directory `tokenizer`.
  """
  name, options = config.name, dict(config.get("options") or {})
  if name not in TASKS:
    raise ValueError(f"Unknown task {name!r}; known: {', '.join(TASKS)}.")
  if name == "gsm8k":
    return gsm8k_task(config, data_dir=data_dir, tokenizer_dir=tokenizer)
  if name == "key_token":
    task_config = task_options(key_token.KeyTokenConfig, options)
    prompt_length, response_length = task_config.prompt_length, task_config.length
  elif name == "key_turns":
    task_config = task_options(key_turns.KeyTurnsConfig, options)
    prompt_length, response_length = 2, task_config.episode_length
  elif name == "target_sum":
    task_config = task_options(target_sum.TargetSumConfig, options)
    prompt_length, response_length = task_config.prompt_length, task_config.length
  elif name == "calculator":
    task_config = task_options(calculator.CalculatorConfig, options)
    prompt_length, response_length = config.max_prompt_length, task_config.episode_length
  else:
    task_config, tokenizer, reward = TEXT_TASKS[name](options)
    prompt_length, response_length = config.max_prompt_length, config.max_response_length
  # Named by the task's settings: runs with other options never share a data_dir's files.
  settings = hashlib.sha256(repr(task_config).encode()).hexdigest()[:12]
  builder = builders.get(name, data_dir=data_dir,
                         config=builders.ProceduralConfig(name=f"run_{settings}",
                                                          task=task_config),
                         train_size=config.train_size, test_size=config.test_size, seed=seed)
  builder.download_and_prepare()
  sources = builder.as_data_source()
  common = dict(name=name, max_prompt_length=prompt_length, max_response_length=response_length,
                sources=sources, config=task_config,
                truncated_reward=float(config.get("truncated_reward", 0.0)))
  if name == "key_turns":
    return TrainTask(vocab_size=key_turns.VOCAB_SIZE, pad_id=key_token.PAD, stop_tokens=(),
                     encode=loader.ids_encoder, score=_environment_rewards(name),
                     token_texts=key_turns.token_names,
                     environment=key_turns.KeyTurnsEnv(task_config),
                     max_turns=task_config.n_turns, max_turn_tokens=task_config.turn_length,
                     demonstration_actions=lambda ids: key_turns.demonstration_actions(
                         ids, task_config), **common)
  if name == "calculator":
    tokenizer = CharTokenizer(calculator.ALPHABET)
    return TrainTask(
        vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, stop_tokens=(),
        encode=loader.text_encoder(tokenizer, eos=False), score=_environment_rewards(name),
        token_texts=tokenizer.token_texts, environment=calculator.CalculatorEnv(tokenizer),
        max_turns=task_config.max_turns, max_turn_tokens=task_config.max_turn_tokens,
        turn_end_tokens=tuple(tokenizer.encode(calculator.TURN_END)),
        demonstration_actions=lambda ids: calculator.demonstration_actions(tokenizer.decode(ids)),
        **common)
  if name == "target_sum":
    return TrainTask(vocab_size=target_sum.VOCAB_SIZE, pad_id=target_sum.PAD,
                     stop_tokens=(target_sum.EOS,), encode=loader.ids_encoder,
                     score=lambda tokens, mask, examples: target_sum.reward(
                         tokens, np.asarray([int(e["target"]) for e in examples]), task_config),
                     actions=Actions(allowed=target_sum.allowed_in_rows(task_config)),
                     token_texts=target_sum.token_names, **common)
  if name != "key_token":
    failures = rewards.FailureCount()
    return TrainTask(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                     stop_tokens=(tokenizer.eos_id,), encode=loader.text_encoder(tokenizer),
                     score=_text_scorer(tokenizer, reward, failures),
                     token_texts=tokenizer.token_texts, reward_failures=failures, **common)

  def score_keys(tokens, mask, examples):
    del mask  # every response has exactly T actions
    targets = np.stack([np.asarray(e["targets"]) for e in examples])
    return key_token.reward(tokens, targets, task_config)

  return TrainTask(vocab_size=key_token.VOCAB_SIZE, pad_id=key_token.PAD, stop_tokens=(),
                   encode=loader.ids_encoder, score=score_keys,
                   actions=key_token_actions(task_config),
                   token_texts=key_token.token_names, **common)


def within_tokenizer(task: TrainTask, model_vocab_size: int) -> TrainTask:
  """`task`, its actions restricted to its tokenizer's ids when the model's embedding has
  more rows (a padded vocabulary, e.g. Qwen2.5's 151,936 rows for 151,665 tokens): the
  policy never samples, and its log-probs never count, an id the tokenizer lacks."""
  if model_vocab_size <= task.vocab_size or task.actions.allowed is not None:
    return task
  ids = np.arange(model_vocab_size) < task.vocab_size
  return dataclasses.replace(task, actions=task.actions._replace(allowed=ids))


def key_token_actions(config: key_token.KeyTokenConfig) -> Actions:
  """key_token's typed actions over whole rows: keys at the decisive positions, filler
  elsewhere (`key_token.allowed`), filler hidden from later inputs when filler_blind; the
  prompt is always seen."""
  hidden = key_token.observe(np.zeros(config.length, np.int32), config) == key_token.FILL
  hidden_in_rows = np.concatenate([np.zeros(config.prompt_length, bool), hidden])
  return Actions(allowed=key_token.allowed_in_rows(config),
                 hidden=hidden_in_rows if hidden.any() else None, hidden_token=key_token.FILL)


def _environment_rewards(name: str) -> Scorer:
  """The `score` of a multi-turn task: its rewards come from its environment, turn by turn."""

  def score(tokens, mask, examples):
    raise ValueError(f"Task {name!r} is multi-turn: its rewards come from its environment "
                     "(rollout_sources.MultiTurn), so whole responses cannot be scored on their "
                     "own (e.g. by Monte-Carlo continuations).")

  return score


def gsm8k_task(config, *, data_dir: str, tokenizer_dir: str | None) -> TrainTask:
  """GSM8K-format JSONL with a pretrained checkpoint's tokenizer and chat template.

  config: jsonl_dir (train.jsonl and test.jsonl), prompt ("chat": the chat
  template's rendering of [system_prompt] + question + instruction, with the
  assistant header; "plain": BOS + question + instruction), instruction,
  system_prompt, template_variables, max_prompt_length, max_response_length,
  truncated_reward. The data are prepared under `data_dir`/gsm8k-<digest of
  the files>, so edited files are never served from a stale copy. Stop tokens:
  the tokenizer's eos_token and the directory's generation_config.json EOS ids.
  The reward is 1 when the response's final number equals the answer's.
  """
  if not tokenizer_dir:
    raise ValueError("Task gsm8k needs a Hugging Face tokenizer: set --config.model.checkpoint "
                     "(a checkpoint directory with tokenizer.json) or --config.task.tokenizer.")
  if not config.get("jsonl_dir"):
    raise ValueError("Task gsm8k needs --config.task.jsonl_dir: a directory holding GSM8K's "
                     "train.jsonl and test.jsonl.")
  prompt = config.get("prompt", "chat")
  _checks.check_choice(prompt, ("chat", "plain"), "task.prompt")
  tokenizer = HFTokenizer(tokenizer_dir)
  instruction = config.get("instruction", "")
  if prompt == "chat":
    encode = loader.chat_encoder(tokenizer, instruction=instruction,
                                 system_prompt=config.get("system_prompt"),
                                 template_variables=dict(config.get("template_variables") or {}))
  else:
    encode = loader.text_encoder(tokenizer, instruction=instruction)
  files = gsm8k.manual_files(config.jsonl_dir)
  digest = hashlib.sha256(b"".join(path.read_bytes() for path in files.values())).hexdigest()
  builder = builders.get("gsm8k", data_dir=str(pathlib.Path(data_dir) / f"gsm8k-{digest[:16]}"))
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=config.jsonl_dir))
  reward = lambda response, example: gsm8k.reward(response, loader.as_text(example["answer"]))
  stops = {tokenizer.eos_id, *huggingface.stop_tokens(tokenizer_dir)} - {None}
  if not stops:
    raise ValueError(f"The tokenizer in {tokenizer_dir} has no eos_token and no "
                     "generation_config.json EOS id: responses could never end.")
  failures = rewards.FailureCount()
  return TrainTask(name="gsm8k", vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                   stop_tokens=tuple(sorted(stops)), max_prompt_length=config.max_prompt_length,
                   max_response_length=config.max_response_length,
                   sources=builder.as_data_source(), encode=encode,
                   score=_text_scorer(tokenizer, reward, failures), reward_failures=failures,
                   pretrained_vocab=True,
                   token_texts=tokenizer.token_texts,
                   truncated_reward=float(config.get("truncated_reward", 0.0)))


def noisy_demonstrations(tokens: np.ndarray, loss_mask: np.ndarray, rng: np.random.Generator, *,
                         rate: float, task: TrainTask) -> np.ndarray:
  """Replaces one completion token of a `rate` fraction of demonstrations by
  another allowed action (stop tokens kept), so SFT leaves an imperfect policy."""
  tokens = tokens.copy()
  allowed = task.actions.allowed
  for row in np.flatnonzero(rng.random(len(tokens)) < rate):
    columns = [c for c in np.flatnonzero(loss_mask[row]) if tokens[row, c] not in task.stop_tokens]
    if not columns:
      continue
    column = rng.choice(columns)
    choices = (np.arange(task.vocab_size) if allowed is None
               else np.flatnonzero(allowed if allowed.ndim == 1 else allowed[column]))
    choices = [
        c for c in choices
        if c != tokens[row, column] and c not in task.stop_tokens and c != task.pad_id
    ]
    if choices:
      tokens[row, column] = rng.choice(choices)
  return tokens


def _all_examples(source) -> list:
  """Every example of a random-access source (TFDS sources read them in one batched call)."""
  if hasattr(source, "__getitems__"):
    return list(source.__getitems__(list(range(len(source)))))
  return [source[i] for i in range(len(source))]


def split_lengths(task: TrainTask, split: str) -> np.ndarray:
  """[n, 2] token counts (prompt, completion with its stop token) of a split's examples."""
  examples = _all_examples(task.sources[split])
  return np.asarray([[len(ids) for ids in task.encode(e)] for e in examples]).reshape(-1, 2)


def check_data(task: TrainTask, *, max_dropped_fraction: float,
               lengths: dict[str, np.ndarray] | None = None) -> dict:
  """Counts, per split, the examples the budgets exclude and says so; returns
  {"data/<split>/examples" | "/dropped" | "/unrewardable": count}.

  dropped: prompt longer than max_prompt_length (the loader skips it);
  unrewardable: reference answer (with its stop token) longer than
  max_response_length, so a response can never both finish and be right.
  Raises ValueError when a split would lose more than `max_dropped_fraction`
  of its examples; warns for unrewardable answers. `lengths`: {split:
  split_lengths(task, split)} when already read."""
  report = {}
  for split in sorted(task.sources):
    counts = split_lengths(task, split) if lengths is None else lengths[split]
    n = len(counts)
    dropped = int(np.sum(counts[:, 0] > task.max_prompt_length))
    unrewardable = int(np.sum(counts[:, 1] > task.max_response_length))
    report.update({f"data/{split}/examples": n, f"data/{split}/dropped": dropped,
                   f"data/{split}/unrewardable": unrewardable})
    if dropped > max_dropped_fraction * n:
      raise ValueError(
          f"{dropped} of {n} {split} examples ({dropped / n:.1%}) have prompts longer than "
          f"max_prompt_length = {task.max_prompt_length} tokens (longest "
          f"{counts[:, 0].max()}) and would be dropped, more than task.max_dropped_fraction = "
          f"{max_dropped_fraction}; raise max_prompt_length or task.max_dropped_fraction.")
    if dropped:
      print(f"{split}: dropped {dropped} of {n} examples whose prompt is longer than "
            f"max_prompt_length = {task.max_prompt_length} tokens.")
    if unrewardable:
      print(f"Warning: {unrewardable} of {n} {split} answers need more than max_response_length = "
            f"{task.max_response_length} tokens (longest {counts[:, 1].max()}, stop token "
            "included): a response is cut off there and scored truncated_reward = "
            f"{task.truncated_reward}.")
  return report


def evaluation_batch(task: TrainTask, prompt_lengths=None, limit: int | None = None) -> dict:
  """Every test prompt that fits max_prompt_length exactly once (the first
  `limit` of them when given), left-padded, with its example (for greedy eval;
  len(batch["examples"]) is how many). `prompt_lengths`: the test prompts'
  token counts when already read."""
  source = loader.Loader(_all_examples(task.sources["test"]), encode=task.encode, batch_size=1,
                         max_prompt_length=task.max_prompt_length, pad_id=task.pad_id,
                         process_index=0, process_count=1, prompt_lengths=prompt_lengths)
  return source.every_prompt(limit)


def batch_chunks(batch: dict, size: int | None):
  """Yields (chunk, rows): `batch`'s prompts in chunks of `size` rows (None: one
  chunk), the last padded to `size` with copies of its first row so that every
  chunk has one shape (one compilation); `rows` of the chunk are real."""
  total = len(batch["examples"])
  size = size or total
  for start in range(0, total, size):
    rows = min(size, total - start)
    take = np.concatenate([np.arange(start, start + rows), np.full(size - rows, start)])
    yield {"prompts": batch["prompts"][take], "prompt_valid": batch["prompt_valid"][take],
           "examples": [batch["examples"][i] for i in take]}, rows


def multi_turn_source(task: TrainTask, *, group_size: int = 1, temperature: float = 1.0,
                      place: Callable = jnp.asarray, local: Callable = np.asarray) -> MultiTurn:
  """The rollout source of a task with an environment (ValueError for one without)."""
  if task.environment is None:
    raise ValueError(f"Task {task.name!r} has no environment: it is not multi-turn.")
  return MultiTurn(task.environment, max_turns=task.max_turns,
                   max_turn_tokens=task.max_turn_tokens,
                   max_episode_tokens=task.max_response_length,
                   turn_end_tokens=task.turn_end_tokens, group_size=group_size,
                   temperature=temperature, pad_id=task.pad_id, place=place, local=local)
