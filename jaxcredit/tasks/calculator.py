"""`calculator`: arithmetic with a calculator tool whose results come back as observations.

Prompt `47*38+215=` (character tokens). In each turn the policy writes either
a tool call or its answer, ended by `;` (the turn-end token):

  C<expression>;   the environment evaluates + - * over integers (a parser,
                   never `eval`) and shows `=<value>;`, or `E;` when it cannot;
  A<integer>;      the answer: the episode ends with reward 1 if it equals the
                   problem's value, 0 otherwise.

Anything else (or a turn cut off before `;`) is shown `E;` and the episode
goes on, up to the driver's turn budget; an episode that never answers is
truncated with reward 0. A demonstration: `C47*38;` `=1786;` `A2001;` would
be wrong (it forgot +215); `C47*38+215;` `=2001;` `A2001;` is right.
"""

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from jaxcredit import _checks
from jaxcredit.tasks import builders, procedural, task
from jaxcredit.tasks.countdown import ExpressionError, parse
from jaxcredit.tasks.loader import as_text
from jaxcredit.tasks.tokenizers import CharTokenizer

ALPHABET = "0123456789+-*=;ACE"
TURN_END = ";"
OPERATORS = "+*"


@dataclasses.dataclass(frozen=True)
class CalculatorConfig:
  """The problem distribution and budget of calculator.

  Attributes:
    n_operands: numbers in the problem.
    min_digits: the shortest number.
    max_digits: the longest number.
    max_turns: turns per episode.
    max_turn_tokens: characters per turn.
  """

  n_operands: int = 3
  min_digits: int = 2
  max_digits: int = 3
  max_turns: int = 3
  max_turn_tokens: int = 16

  def __post_init__(self):
    _checks.require([
        (2 <= self.n_operands <= 6, f"n_operands must be in [2, 6], got {self.n_operands}"),
        (1 <= self.min_digits <= self.max_digits <= 6,
         f"need 1 <= min_digits <= max_digits <= 6, got {self.min_digits}, {self.max_digits}"),
        (self.max_turns >= 1, f"max_turns must be >= 1, got {self.max_turns}"),
        (self.max_turn_tokens >= 3, f"max_turn_tokens must be >= 3, got {self.max_turn_tokens}"),
    ])

  @property
  def episode_length(self) -> int:
    """Columns an episode may take: each turn and an observation of up to as many characters."""
    return 2 * self.max_turns * self.max_turn_tokens


def make_example(rng: np.random.Generator, config: CalculatorConfig) -> dict:
  """One calculator problem.

  Args:
    rng: the NumPy generator.
    config: the task's options.

  Returns:
    ``{"prompt": "a*b+c=", "answer": its value, "completion": a right demonstration (the
    tool call, its result and the answer)}``.
  """
  digits = rng.integers(config.min_digits, config.max_digits + 1, config.n_operands)
  numbers = [str(int(rng.integers(10 ** (d - 1), 10**d))) for d in digits]
  operators = rng.choice(list(OPERATORS), config.n_operands - 1)
  expression = numbers[0] + "".join(op + n for op, n in zip(operators, numbers[1:]))
  answer = str(parse(expression)[0])
  return {"prompt": expression + "=", "answer": answer,
          "completion": f"C{expression};={answer};A{answer};"}


def evaluate(expression: str) -> str:
  """The tool's reply to ``C<expression>;``.

  Args:
    expression: the expression the policy wrote.

  Returns:
    ``=<value>;``, or ``E;`` for a malformed expression.

  Examples:
    >>> from jaxcredit.tasks import calculator
    >>> calculator.evaluate("12*3+4"), calculator.evaluate("1+")
    ('=40;', 'E;')
  """
  if not expression or set(expression) - set("0123456789+-*"):
    return "E;"
  try:
    value = parse(expression)[0]
  except ExpressionError:
    return "E;"
  return f"={value};"


@dataclasses.dataclass(frozen=True)
class CalculatorEnv:
  """The calculator environment (`rollout_sources.environment.Environment`); the state is the
  answer.

  Attributes:
    tokenizer: the character tokenizer of observations and actions.
  """

  tokenizer: CharTokenizer = CharTokenizer(ALPHABET)

  def reset(self, rng: np.random.Generator, example) -> tuple[str, np.ndarray]:
    del rng
    return as_text(example["answer"]), np.zeros(0, np.int32)

  def step(self, answer: str, actions: np.ndarray):
    text = self.tokenizer.decode(actions)
    turn, ended = text.removesuffix(TURN_END), text.endswith(TURN_END)
    if ended and turn.startswith("A"):
      return answer, np.zeros(0, np.int32), float(turn[1:] == answer), True
    reply = evaluate(turn[1:]) if ended and turn.startswith("C") else "E;"
    return answer, np.asarray(self.tokenizer.encode(reply), np.int32), 0.0, False


def demonstration_actions(completion: str) -> np.ndarray:
  """The policy's characters of a demonstration (its turns), False on the tool's replies
  (``=...;``, ``E;``).

  Args:
    completion: the demonstration's text.

  Returns:
    bool ``[len(completion)]``.
  """
  actions, in_reply = np.ones(len(completion), bool), False
  for i, char in enumerate(completion):
    in_reply = in_reply or (char in "=E" and (i == 0 or completion[i - 1] == TURN_END))
    actions[i] = not in_reply
    in_reply = in_reply and char != TURN_END
  return actions


class Calculator(builders.ProceduralBuilder):
  """The TFDS builder of calculator: arithmetic with a calculator tool."""

  make_example = staticmethod(make_example)
  FEATURES = {
      "prompt": tfds.features.Text(),
      "completion": tfds.features.Text(),
      "answer": tfds.features.Text(),
  }
  BUILDER_CONFIGS = [
      builders.ProceduralConfig(name="n3", task=CalculatorConfig(),
                                description="3 operands of 2-3 digits, + and *"),
  ]


def train_task(config, *, data_dir: str, seed: int,
               tokenizer: str | None = None) -> task.TrainTask:
  """calculator bound to its data: a multi-turn task whose rewards come from `CalculatorEnv`;
  SFT trains on the policy's turns of a demonstration only.

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
  options = task.options_of(CalculatorConfig, config)
  characters = CharTokenizer(ALPHABET)
  return procedural.character_environment_task(
      "calculator", config, options, characters, CalculatorEnv(characters), turn_end=TURN_END,
      data_dir=data_dir, seed=seed,
      demonstration_actions=lambda ids: demonstration_actions(characters.decode(ids)))


TASK = task.register(task.Task(name="calculator", options=CalculatorConfig, data=Calculator,
                               train=train_task))
