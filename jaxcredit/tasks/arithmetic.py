"""Multi-digit arithmetic with a verifiable answer (the quickstart task).

Prompt `a+b=` or `a*b=`; the response is the result, by default with its
digits reversed (least significant first: what a small model learns from
outcome reward alone), optionally preceded by a step-by-step scratchpad::

  add: `C:<carry into each column, least significant first>;<answer>`
  mul: `P:<partial products a*b_j, reversed, comma-separated>;<answer>`

The final answer follows the last `;` (or is the whole response without a
scratchpad). Rewards are exact match on the extracted answer.

With `held_out` > 0 the splits share no problem: a stable hash of the prompt puts
that fraction of all problems in the test split's share (`in_test_share`), and
each split draws only from its own.
"""

import dataclasses
import zlib

import numpy as np
import tensorflow_datasets as tfds

from jaxcredit.tasks import builders, loader, procedural, rewards, task

ALPHABET = "0123456789+*=;:,CP"
OPERATIONS = {"add": "+", "mul": "*"}


@dataclasses.dataclass(frozen=True)
class ArithmeticConfig:
  """The problem distribution of arithmetic.

  Attributes:
    min_digits: the shortest operand (the difficulty knob).
    max_digits: the longest operand.
    operation: "add" or "mul".
    scratchpad: show carries / partial products in the demonstration.
    reverse_answer: write the answer least-significant digit first.
    held_out: the fraction of problems only the test split draws (0: both splits draw from
      all).
  """

  min_digits: int = 2
  max_digits: int = 3
  operation: str = "add"
  scratchpad: bool = False
  reverse_answer: bool = True
  held_out: float = 0.0

  def __post_init__(self):
    if not 0.0 <= self.held_out < 1.0:
      raise ValueError(f"Need 0 <= held_out < 1, got {self.held_out}.")
    if self.operation not in OPERATIONS:
      raise ValueError(f"Unknown operation {self.operation!r}; known: {', '.join(OPERATIONS)}.")
    if not 1 <= self.min_digits <= self.max_digits:
      raise ValueError(
          f"Need 1 <= min_digits <= max_digits, got {self.min_digits}, {self.max_digits}.")


def _operand(rng: np.random.Generator, config: ArithmeticConfig) -> int:
  digits = int(rng.integers(config.min_digits, config.max_digits + 1))
  return int(rng.integers(10 ** (digits - 1) if digits > 1 else 0, 10**digits))


def _digits(n: int, reverse: bool) -> str:
  return str(n)[::-1] if reverse else str(n)


def _scratchpad(a: int, b: int, config: ArithmeticConfig) -> str:
  if config.operation == "add":
    carries, carry = [], 0
    for i in range(max(len(str(a)), len(str(b)))):
      carries.append(str(carry))
      carry = (a // 10**i % 10 + b // 10**i % 10 + carry) // 10
    return "C:" + "".join(carries) + ";"
  partials = [_digits(a * int(d) * 10**i, True) for i, d in enumerate(reversed(str(b)))]
  return "P:" + ",".join(partials) + ";"


def make_example(rng: np.random.Generator, config: ArithmeticConfig) -> dict:
  """One arithmetic problem.

  Args:
    rng: the NumPy generator.
    config: the task's options.

  Returns:
    ``{"prompt", "completion" (a demonstration), "answer", "a", "b"}``.
  """
  a, b = _operand(rng, config), _operand(rng, config)
  result = a + b if config.operation == "add" else a * b
  answer = _digits(result, config.reverse_answer)
  prefix = _scratchpad(a, b, config) if config.scratchpad else ""
  return {
      "prompt": f"{a}{OPERATIONS[config.operation]}{b}=",
      "completion": prefix + answer,
      "answer": answer,
      "a": a,
      "b": b,
  }


def in_test_share(prompt: str, config: ArithmeticConfig) -> bool:
  """Whether a problem belongs to the test split's share: crc32(prompt) in the lowest
  `held_out` fraction of its range.

  Args:
    prompt: the problem's prompt.
    config: the task's options.

  Returns:
    bool.
  """
  return zlib.crc32(prompt.encode()) < config.held_out * 2**32


def split_example(rng: np.random.Generator, config: ArithmeticConfig, split: str,
                  max_draws: int = 100_000) -> dict:
  """`make_example` redrawn until the problem is in a split's share (when config.held_out > 0).

  Args:
    rng: the NumPy generator.
    config: the task's options.
    split: "train" or "test".
    max_draws: draws before giving up.

  Returns:
    the example.

  Raises:
    ValueError: when `max_draws` draws find none.
  """
  for _ in range(max_draws):
    example = make_example(rng, config)
    if not config.held_out or in_test_share(example["prompt"], config) == (split == "test"):
      return example
  raise ValueError(f"No {split} problem in {max_draws} draws from {config}: the problems are "
                   "too few for held_out to leave each split some; change held_out or the digits.")


def extract_answer(response: str) -> str | None:
  """The final answer: the text after the last ``;`` (or all of it).

  Args:
    response: the decoded response.

  Returns:
    the answer, or None when it is empty.

  Examples:
    >>> from jaxcredit.tasks import arithmetic
    >>> arithmetic.extract_answer("c1;  24 ")
    '24'
  """
  answer = response.rsplit(";", 1)[-1].strip()
  return answer or None


def reward(response: str, answer: str) -> tuple[float, str]:
  """1.0 when the extracted answer equals the reference exactly, else 0.0.

  Args:
    response: the decoded response.
    answer: the reference answer.

  Returns:
    ``(reward, reason)``.
  """
  return rewards.exact_match(extract_answer(response), answer)


class Arithmetic(builders.ProceduralBuilder):
  """The TFDS builder of arithmetic: multi-digit addition / multiplication."""

  make_example = staticmethod(make_example)
  FEATURES = {
      "prompt": tfds.features.Text(),
      "completion": tfds.features.Text(),
      "answer": tfds.features.Text(),
      "a": np.int64,
      "b": np.int64,
  }

  def _example(self, rng, options, split):
    return split_example(rng, options, split)  # options.held_out: splits share no problem

  BUILDER_CONFIGS = [
      builders.ProceduralConfig(name="add_2to3_reversed", task=ArithmeticConfig(),
                                description="a+b, 2-3 digits, reversed answer"),
      builders.ProceduralConfig(
          name="add_3to5_scratchpad",
          task=ArithmeticConfig(min_digits=3, max_digits=5, scratchpad=True),
          description="a+b, 3-5 digits, carries then reversed answer",
      ),
      builders.ProceduralConfig(
          name="mul_2to3_scratchpad",
          task=ArithmeticConfig(operation="mul", scratchpad=True),
          description="a*b, 2-3 digits, partial products then reversed answer",
      ),
  ]


def train_task(config, *, data_dir: str, seed: int,
               tokenizer: str | None = None) -> task.TrainTask:
  """arithmetic bound to its data: characters over ALPHABET, rewarded by `reward`.

  Args:
    config: the run's ``task`` config (options, sizes, length budgets).
    data_dir: where the dataset is built (or reused).
    seed: the data seed.
    tokenizer: unused (the task brings its own tokenizer).

  Returns:
    the `TrainTask`.

  Raises:
    ValueError: on unknown options.
  """
  del tokenizer
  return procedural.character_task(
      "arithmetic", config, task.options_of(ArithmeticConfig, config), ALPHABET,
      lambda response, example: reward(response, loader.as_text(example["answer"])),
      data_dir=data_dir, seed=seed)


TASK = task.register(task.Task(name="arithmetic", options=ArithmeticConfig, data=Arithmetic,
                               train=train_task))
