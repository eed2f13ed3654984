"""`target_sum`: a credit probe where early choices constrain later ones (an exact
task of the credit lab, `jaxcredit.lab`).

Token ids (V = 24): 0 PAD, 1 BOS, 2 SEP, 3 EOS, 4-13 the digits 0..9 (prompt numerals
and actions), 14-23 reserved.

Prompt `[BOS, n, S_tens, S_units, SEP]` (digit tokens). The response is up to n digits
in 0..m-1, then EOS: sampled by the policy where it stops early (`eos_allowed`), the
only allowed token after n digits (a forced step: log-prob 0, no gradient), so every
response ends with EOS within its n + 1 columns. The reward is

  R = 1[sum of the digits = S]  (and, with `exact_len`, exactly n digits; with
                                  `no_repeat`, no digit equal to the one before it).

A digit that overshoots S, or that leaves S out of reach of the digits still to come,
decides R = 0 at once: the decisive positions differ from response to response, and
near the edges of [0, (m - 1) n] the early digits decide.
"""

import dataclasses
import functools

import numpy as np
import tensorflow_datasets as tfds

from jaxcredit import _checks
from jaxcredit.sampling import Actions
from jaxcredit.tasks import builders, loader, procedural, task

PAD, BOS, SEP, EOS, DIGIT0 = 0, 1, 2, 3, 4
VOCAB_SIZE = 24
PROMPT_LENGTH = 5


@dataclasses.dataclass(frozen=True)
class TargetSumConfig:
  """The target_sum probe's settings.

  Attributes:
    n_digits: n, the most digits a response holds (1..9).
    n_values: m, the digits 0..m-1 an action may be (2..10).
    target_low: the smallest target S.
    target_high: the largest target S (S ~ U[target_low, target_high], each reachable,
      checked).
    eos_allowed: the policy may stop before n digits.
    exact_len: a reward option (module docstring).
    no_repeat: a reward option (module docstring).
  """

  n_digits: int = 6
  n_values: int = 4
  target_low: int = 3
  target_high: int = 15
  eos_allowed: bool = True
  exact_len: bool = False
  no_repeat: bool = False

  def __post_init__(self):
    _checks.require([
        (1 <= self.n_digits <= 9, f"n_digits must be in [1, 9], got {self.n_digits}"),
        (2 <= self.n_values <= 10, f"n_values must be in [2, 10], got {self.n_values}"),
        (0 <= self.target_low <= self.target_high <= min(99, self.max_sum),
         f"targets must satisfy 0 <= target_low <= target_high <= min(99, (n_values - 1) "
         f"n_digits = {self.max_sum}), got [{self.target_low}, {self.target_high}]"),
    ])
    unreachable = [s for s in range(self.target_low, self.target_high + 1)
                   if not _completions(self, s)[0, 0, self.n_values]]
    if unreachable:
      raise ValueError(f"No response earns the reward for the targets {unreachable} under "
                       f"{self}: narrow [target_low, target_high].")

  @property
  def max_sum(self) -> int:
    return (self.n_values - 1) * self.n_digits

  @property
  def length(self) -> int:
    """Response columns: n digits and the EOS."""
    return self.n_digits + 1

  @property
  def prompt_length(self) -> int:
    return PROMPT_LENGTH

  @property
  def digits(self) -> np.ndarray:
    """Token ids of the action digits 0..m-1."""
    return np.arange(DIGIT0, DIGIT0 + self.n_values)


def token_names(ids) -> list[str]:
  """The readable name of each token id: PAD BOS SEP EOS, the digits 0-9, R14..R23.

  Args:
    ids: int ids, any shape.

  Returns:
    the names, flattened.

  Raises:
    ValueError: on ids outside the vocabulary.

  Examples:
    >>> from jaxcredit.tasks import target_sum
    >>> target_sum.token_names([1, 4, 13, 3])
    ['BOS', '0', '9', 'EOS']
  """
  names = ["PAD", "BOS", "SEP", "EOS", *map(str, range(10)),
           *(f"R{i}" for i in range(DIGIT0 + 10, VOCAB_SIZE))]
  ids = np.asarray(ids)
  if ids.size and (ids.min() < 0 or ids.max() >= VOCAB_SIZE):
    raise ValueError(f"Token ids must be in [0, {VOCAB_SIZE}), got {ids.min()}..{ids.max()}.")
  return [names[i] for i in ids.tolist()]


def allowed(config: TargetSumConfig) -> np.ndarray:
  """The actions allowed at each response position: the digits 0..m-1 (and EOS when
  eos_allowed) in the first n columns, EOS alone in the last.

  Args:
    config: the task's `TargetSumConfig`.

  Returns:
    bool ``[n + 1, V]``.
  """
  table = np.zeros((config.length, VOCAB_SIZE), bool)
  table[:-1, config.digits] = True
  table[:-1, EOS] = config.eos_allowed
  table[-1, EOS] = True
  return table


def allowed_in_rows(config: TargetSumConfig) -> np.ndarray:
  """`allowed` over whole rows, the prompt columns allowing every token.

  Args:
    config: the task's `TargetSumConfig`.

  Returns:
    bool ``[5 + n + 1, V]``.
  """
  return np.concatenate([np.ones((PROMPT_LENGTH, VOCAB_SIZE), bool), allowed(config)])


def outcome(digits, target, config: TargetSumConfig):
  """The reward of responses of k digits then EOS. NumPy or JAX arrays (traceable).

  Args:
    digits: ``[..., k]`` digit values 0..m-1.
    target: ``[...]`` the sums S, broadcast against them.
    config: the task's `TargetSumConfig`.

  Returns:
    float32 ``[...]``.
  """
  k = digits.shape[-1]
  hit = digits.sum(axis=-1) == target
  if config.exact_len and k != config.n_digits:
    hit = hit & False
  if config.no_repeat and k > 1:
    hit = hit & (digits[..., 1:] != digits[..., :-1]).all(axis=-1)
  return hit.astype(np.float32)


def reward(responses: np.ndarray, targets: np.ndarray, config: TargetSumConfig) -> np.ndarray:
  """The reward of responses against their target sums; a response without EOS, or with a
  non-digit before it, earns 0.

  Args:
    responses: ``[B, n + 1]`` token ids.
    targets: ``[B]`` the sums S.
    config: the task's `TargetSumConfig`.

  Returns:
    float32 ``[B]``.

  Raises:
    ValueError: on shapes other than ``[B, n + 1]`` and ``[B]``.
  """
  responses, targets = np.atleast_2d(responses), np.atleast_1d(targets)
  if responses.shape[1] != config.length or targets.shape != responses.shape[:1]:
    raise ValueError(f"Expected responses [B, {config.length}] and targets [B], got "
                     f"{responses.shape} and {targets.shape}.")
  out = np.zeros(len(responses), np.float32)
  for row, (response, target) in enumerate(zip(responses, targets)):
    ends = np.flatnonzero(response == EOS)
    if not len(ends):
      continue
    values = response[:ends[0]] - DIGIT0
    if np.all((values >= 0) & (values < config.n_values)):
      out[row] = outcome(values, int(target), config)
  return out


@functools.lru_cache(maxsize=256)
def _completions(config: TargetSumConfig, target: int) -> np.ndarray:
  """[n + 1, S + 1, m + 1] int: the rewarded completions of a response with k digits,
  partial sum sigma and last digit d (m: none yet), counted by dynamic programming."""
  n, m = config.n_digits, config.n_values
  count = np.zeros((n + 1, target + 1, m + 1), np.int64)
  for k in reversed(range(n + 1)):
    for sigma in range(target + 1):
      for last in range(m + 1):
        stop = sigma == target and (k == n or (config.eos_allowed and not config.exact_len))
        more = 0
        if k < n:
          more = sum(count[k + 1, sigma + d, d] for d in range(m)
                     if sigma + d <= target and not (config.no_repeat and d == last))
        count[k, sigma, last] = int(stop) + more
  return count


def prompts(sums, config: TargetSumConfig):
  """The prompts ``[BOS, n, S_tens, S_units, SEP]`` of target sums, n the digit count.

  Args:
    sums: ``[n]`` the sums S (a NumPy or a JAX array, traced or not; the result is the same
      kind).
    config: the task's `TargetSumConfig`.

  Returns:
    int32 ``[n, 5]``.
  """
  layout = np.asarray([BOS, DIGIT0 + config.n_digits, DIGIT0, DIGIT0, SEP], np.int32)
  place, holds_s = np.asarray([1, 1, 10, 1, 1]), np.asarray([0, 0, 1, 1, 0])
  return (sums[:, None] // place % 10 * holds_s + layout).astype(np.int32)


def make_example(rng: np.random.Generator, config: TargetSumConfig) -> dict:
  """One target_sum example, its demonstration drawn uniformly among the rewarded responses.

  Args:
    rng: the NumPy generator.
    config: the task's `TargetSumConfig`.

  Returns:
    ``{"prompt" [5] ids, "target" S, "completion" [k + 1] (k digits and EOS) with reward 1}``.
  """
  target = int(rng.integers(config.target_low, config.target_high + 1))
  count = _completions(config, target)
  values, sigma, last = [], 0, config.n_values
  while True:
    k = len(values)
    stop = int(sigma == target and (k == config.n_digits or (config.eos_allowed
                                                             and not config.exact_len)))
    options = [(d, count[k + 1, sigma + d, d]) for d in range(config.n_values)
               if k < config.n_digits and sigma + d <= target
               and not (config.no_repeat and d == last)]
    weights = np.asarray([stop] + [c for _, c in options], np.float64)
    choice = rng.choice(len(weights), p=weights / weights.sum())
    if choice == 0:
      break
    last = options[choice - 1][0]
    values.append(last)
    sigma += last
  completion = np.asarray([DIGIT0 + d for d in values] + [EOS], np.int32)
  return {"prompt": prompts(np.asarray([target]), config)[0], "target": target,
          "completion": completion}


class TargetSum(builders.ProceduralBuilder):
  """The TFDS builder of target_sum, a credit probe with sequential dependence (ids)."""

  make_example = staticmethod(make_example)
  FEATURES = {
      "prompt": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "target": np.int64,
      "completion": tfds.features.Tensor(shape=(None,), dtype=np.int32),
  }
  BUILDER_CONFIGS = [
      builders.ProceduralConfig(
          name="n6_m4", task=TargetSumConfig(),
          description="up to 6 digits in 0..3 summing to S ~ U[3, 15], EOS allowed"),
  ]


def train_task(config, *, data_dir: str, seed: int,
               tokenizer: str | None = None) -> task.TrainTask:
  """target_sum bound to its data: ids, responses ending at a sampled or forced EOS.

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
  options = task.options_of(TargetSumConfig, config)
  return task.TrainTask(
      vocab_size=VOCAB_SIZE, pad_id=PAD, stop_tokens=(EOS,),
      max_prompt_length=options.prompt_length, max_response_length=options.length,
      encode=loader.ids_encoder,
      score=lambda tokens, mask, examples: reward(
          tokens, np.asarray([int(e["target"]) for e in examples]), options),
      actions=Actions(allowed=allowed_in_rows(options)), token_texts=token_names,
      **procedural.fields("target_sum", config, options, data_dir=data_dir, seed=seed))
