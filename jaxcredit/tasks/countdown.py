"""Countdown (the TinyZero task): reach a target from given numbers with + - * /.

Prompt `n1,n2,n3,n4>target:`; the response is an arithmetic expression that
uses each given number exactly once, optionally wrapped in
`<answer>...</answer>` (the last such span counts). The verifier parses the
expression with a small recursive-descent parser over digits, `+ - * /` and
parentheses - never `eval` - and evaluates it with exact fractions.
"""

import dataclasses
import re
from fractions import Fraction

import numpy as np
import tensorflow_datasets as tfds

from jaxcredit.tasks import builders, procedural, rewards, task

ALPHABET = "".join(dict.fromkeys("0123456789+-*/(),>: <answer></answer>"))  # unique characters
_TOKEN = re.compile(r"[0-9]+|[-+*/()]")  # ASCII digits only
MAX_EXPRESSION_CHARS = 200


@dataclasses.dataclass(frozen=True)
class CountdownConfig:
  """The problem distribution of countdown.

  Attributes:
    n_numbers: how many numbers (the difficulty knob).
    max_number: numbers are drawn from [1, max_number].
    format_score: the reward of a well-formed expression that uses the numbers correctly
      but misses the target (TinyZero: 0.1).
  """

  n_numbers: int = 4
  max_number: int = 99
  format_score: float = 0.1

  def __post_init__(self):
    if not 2 <= self.n_numbers <= 8:
      raise ValueError(f"n_numbers must be in [2, 8], got {self.n_numbers}.")


class ExpressionError(ValueError):
  """The response is not a well-formed expression over the allowed tokens."""


def _tokenize(text: str) -> list[str]:
  compact = "".join(text.split())
  if not compact:
    raise ExpressionError("empty expression")
  if len(compact) > MAX_EXPRESSION_CHARS:
    raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
  tokens = _TOKEN.findall(compact)
  if "".join(tokens) != compact:
    bad = sorted(set(re.sub(r"[0-9+\-*/()]", "", compact)))
    raise ExpressionError(f"characters {bad} are not allowed")
  return tokens


def parse(text: str) -> tuple[Fraction, list[int]]:
  """The value of an arithmetic expression over integers and the numbers it uses.

  Args:
    text: the expression (integers, + - * /, parentheses).

  Returns:
    ``(value, numbers)``: an exact `Fraction` and the integers in order of appearance.

  Raises:
    ExpressionError: when it is malformed or divides by zero.

  Examples:
    >>> from jaxcredit.tasks import countdown
    >>> countdown.parse("(3+5)*2")
    (Fraction(16, 1), [3, 5, 2])
  """
  tokens, pos = _tokenize(text), 0
  numbers: list[int] = []

  def peek():
    return tokens[pos] if pos < len(tokens) else None

  def take():
    nonlocal pos
    pos += 1
    return tokens[pos - 1]

  def expression():
    value = term()
    while peek() in ("+", "-"):
      value = value + term() if take() == "+" else value - term()
    return value

  def term():
    value = factor()
    while peek() in ("*", "/"):
      op, right = take(), factor()
      if op == "/" and right == 0:
        raise ExpressionError("division by zero")
      value = value * right if op == "*" else value / right
    return value

  def factor():
    token = peek()
    if token is None:
      raise ExpressionError("unexpected end of expression")
    take()
    if token == "(":
      value = expression()
      if peek() != ")":
        raise ExpressionError("unbalanced parentheses")
      take()
      return value
    if token[0] in "0123456789":
      numbers.append(int(token))
      return Fraction(int(token))
    raise ExpressionError(f"unexpected {token!r}")

  value = expression()
  if pos != len(tokens):
    raise ExpressionError(f"unexpected {tokens[pos]!r} after the expression")
  return value, numbers


def make_example(rng: np.random.Generator, config: CountdownConfig) -> dict:
  """Numbers, a target reachable by a random expression over them, and that expression.

  Args:
    rng: the NumPy generator.
    config: the task's options.

  Returns:
    ``{"prompt", "completion", "numbers", "target"}``.
  """
  while True:
    numbers = [int(n) for n in rng.integers(1, config.max_number + 1, config.n_numbers)]
    order = rng.permutation(config.n_numbers)
    expression = str(numbers[order[0]])
    for i in order[1:]:
      op = "+-*/"[int(rng.integers(4))]
      left = f"({expression})" if not expression.isdigit() else expression
      candidate = f"{left}{op}{numbers[i]}"
      value, _ = parse(candidate)
      if value.denominator == 1 and value > 0:
        expression = candidate
      else:
        expression = f"{left}+{numbers[i]}"
    target, _ = parse(expression)
    if target.denominator == 1 and 0 < target <= 10 * config.max_number**2:
      break
  return {
      "prompt": ",".join(map(str, numbers)) + f">{int(target)}:",
      "completion": expression,
      "numbers": np.asarray(numbers, np.int32),
      "target": int(target),
  }


def extract_expression(response: str) -> str:
  """The last ``<answer>...</answer>`` span, or the whole response (linear time).

  Args:
    response: the decoded response.

  Returns:
    the expression text.
  """
  span = rewards.last_answer_span(response)
  return response if span is None else span


def reward(response: str, numbers, target: int, *, format_score: float = 0.1) -> tuple[float, str]:
  """1.0 if the expression uses each number exactly once and equals the target; format_score
  if well-formed with the right numbers but another value; else 0.

  Args:
    response: the decoded response.
    numbers: the numbers given.
    target: the target value.
    format_score: the reward of a well-formed, wrong expression.

  Returns:
    ``(reward, reason)``.

  References:
    TinyZero's countdown reward (Pan et al., 2025, github.com/Jiayi-Pan/TinyZero).
  """
  correct, well_formed, reason = _judge(response, numbers, target)
  return (1.0 if correct else format_score if well_formed else 0.0), reason


def reward_components(response: str, numbers, target: int) -> tuple[float, float]:
  """The components of `reward`: correctness and form, each 0 or 1.

  Args:
    response: the decoded response.
    numbers: the numbers given.
    target: the target value.

  Returns:
    ``(correct, well_formed)``: the expression equals the target using each number exactly
    once; it parses and uses each number exactly once (whatever its value).

  Examples:
    >>> from jaxcredit.tasks import countdown
    >>> countdown.reward_components("<answer>3*4</answer>", [3, 4], 12)
    (1.0, 1.0)
    >>> countdown.reward_components("3+4", [3, 4], 12), countdown.reward_components("3+", [3], 3)
    ((0.0, 1.0), (0.0, 0.0))
  """
  correct, well_formed, _ = _judge(response, numbers, target)
  return float(correct), float(well_formed)


def _judge(response: str, numbers, target: int) -> tuple[bool, bool, str]:
  """(correct, well-formed, why) of a response: `reward` and `reward_components` read it."""
  try:
    value, used = parse(extract_expression(response))
  except ExpressionError as error:
    return False, False, f"malformed: {error}"
  if sorted(used) != sorted(int(n) for n in numbers):
    return False, False, f"uses {sorted(used)}, not each of {sorted(int(n) for n in numbers)} once"
  if value != target:
    return False, True, f"evaluates to {value}, not {target}"
  return True, True, "correct"


class Countdown(builders.ProceduralBuilder):
  """The TFDS builder of countdown: reach a target from numbers with + - * /."""

  make_example = staticmethod(make_example)
  FEATURES = {
      "prompt": tfds.features.Text(),
      "completion": tfds.features.Text(),
      "numbers": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "target": np.int64,
  }
  BUILDER_CONFIGS = [
      builders.ProceduralConfig(name="n4", task=CountdownConfig(),
                                description="4 numbers in [1, 99]"),
      builders.ProceduralConfig(name="n3", task=CountdownConfig(n_numbers=3),
                                description="3 numbers"),
  ]


def train_task(config, *, data_dir: str, seed: int,
               tokenizer: str | None = None) -> task.TrainTask:
  """countdown bound to its data: characters over ALPHABET, rewarded by `reward`, its
  components (`reward_components`: correct, well-formed) for GDPO.

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
  options = task.options_of(CountdownConfig, config)
  return procedural.character_task(
      "countdown", config, options, ALPHABET,
      lambda response, example: reward(response, example["numbers"], int(example["target"]),
                                       format_score=options.format_score),
      components=lambda response, example: reward_components(
          response, example["numbers"], int(example["target"])),
      data_dir=data_dir, seed=seed)


TASK = task.register(task.Task(name="countdown", options=CountdownConfig, data=Countdown,
                               train=train_task))
