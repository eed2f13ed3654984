"""`log_lookup`: a long-context tool task: find a key's value in a log that a tool returns a
page at a time, thousands of characters per observation.

Prompt `?3f2a=` (character tokens): the key to look up. The log holds `n_pages` pages of
`page_records` records `kkkk:vv;` (a 4-hex-digit key, a 2-digit value; 8 characters), its
keys distinct, generated from the example's seed; the prompt's key is in exactly one record.
In each turn the policy writes up to `max_turn_tokens` characters, ended by `;`. The answer
`A<value>;` ends the episode with reward 1 if it is the key's value, else 0; any other turn
(a turn cut off before `;` too) reads: the tool shows the next page, or `E;` once every page
has been shown.

An episode that never answers is truncated with reward 0 after ``n_pages + 1`` turns. With
the `LONG` options (48 pages of 264 records) an episode that reads the whole log holds
48 x 2,112 = 101,376 observation tokens: agentic RL's long-context case, a document or log
returned by a tool. A turn's state is the number of pages read (`LogLookupEnv.anchor`).
The data holds no demonstration of the reads (an example's log is rebuilt from its seed), so
the task trains by RL only.
"""

import dataclasses
from typing import NamedTuple

import numpy as np
import tensorflow_datasets as tfds

from jaxcredit import _checks
from jaxcredit.tasks import builders, procedural, task
from jaxcredit.tasks.loader import as_text
from jaxcredit.tasks.tokenizers import CharTokenizer

ALPHABET = "0123456789abcdef:;?=AE"
TURN_END = ";"
RECORD_LENGTH = 8  # kkkk:vv;
KEYS = 16**4


@dataclasses.dataclass(frozen=True)
class LogLookupConfig:
  """The log's size and the turn budget of log_lookup.

  Attributes:
    n_pages: pages in the log.
    page_records: records per page (8 characters each).
    max_turn_tokens: characters per turn (an answer takes 4: ``A<vv>;``).
  """

  n_pages: int = 4
  page_records: int = 16
  max_turn_tokens: int = 4

  def __post_init__(self):
    _checks.require([
        (self.n_pages >= 1, f"n_pages must be >= 1, got {self.n_pages}"),
        (self.page_records >= 1, f"page_records must be >= 1, got {self.page_records}"),
        (self.n_pages * self.page_records <= KEYS,
         f"n_pages * page_records must be at most {KEYS} (distinct 4-hex-digit keys), got "
         f"{self.n_pages * self.page_records}"),
        (self.max_turn_tokens >= 4,
         f"max_turn_tokens must be >= 4 (an answer is A<vv>;), got {self.max_turn_tokens}"),
    ])

  @property
  def max_turns(self) -> int:
    """Turns per episode: a read of every page, then the answer."""
    return self.n_pages + 1

  @property
  def page_length(self) -> int:
    """Characters per page."""
    return RECORD_LENGTH * self.page_records

  @property
  def episode_length(self) -> int:
    """Columns an episode may take: every turn, every page and the final ``E;``."""
    return self.max_turns * self.max_turn_tokens + self.n_pages * self.page_length + 2


LONG = LogLookupConfig(n_pages=48, page_records=264)
"""Options whose episodes exceed 100k tokens when they read the whole log."""


def log(seed: int, config: LogLookupConfig) -> tuple[np.ndarray, np.ndarray]:
  """The log of an example: ``n_pages * page_records`` distinct keys and their values.

  Args:
    seed: the example's seed.
    config: the task's options.

  Returns:
    ``(keys, values)``, int ``[n_pages * page_records]`` each, in page order.
  """
  rng = np.random.default_rng(seed)
  records = config.n_pages * config.page_records
  return rng.choice(KEYS, records, replace=False), rng.integers(0, 100, records)


def page_text(seed: int, page: int, config: LogLookupConfig) -> str:
  """Page `page` of an example's log: its records ``kkkk:vv;``.

  Args:
    seed: the example's seed.
    page: the page, in ``[0, n_pages)``.
    config: the task's options.

  Returns:
    the page's text, `config.page_length` characters.
  """
  keys, values = log(seed, config)
  rows = slice(page * config.page_records, (page + 1) * config.page_records)
  return "".join(f"{k:04x}:{v:02d};" for k, v in zip(keys[rows], values[rows]))


def make_example(rng: np.random.Generator, config: LogLookupConfig) -> dict:
  """One log_lookup problem.

  Args:
    rng: the NumPy generator.
    config: the task's options.

  Returns:
    ``{"prompt": "?kkkk=", "answer": "vv", "seed": the log's seed, "page": the key's page,
    "completion": the answer turn}``.
  """
  seed = int(rng.integers(2**31 - 1))
  keys, values = log(seed, config)
  record = int(rng.integers(len(keys)))
  answer = f"{values[record]:02d}"
  return {"prompt": f"?{keys[record]:04x}=", "answer": answer, "seed": seed,
          "page": record // config.page_records, "completion": f"A{answer};"}


class _State(NamedTuple):
  seed: int
  answer: str
  pages_read: int


@dataclasses.dataclass(frozen=True)
class LogLookupEnv:
  """The log_lookup environment (`rollout_sources.environment.Environment`).

  Attributes:
    config: the task's options.
    tokenizer: the character tokenizer of observations and actions.
  """

  config: LogLookupConfig = LogLookupConfig()
  tokenizer: CharTokenizer = CharTokenizer(ALPHABET)

  def reset(self, rng: np.random.Generator, example) -> tuple[_State, np.ndarray]:
    del rng
    return _State(int(example["seed"]), as_text(example["answer"]), 0), np.zeros(0, np.int32)

  def step(self, state: _State, actions: np.ndarray):
    text = self.tokenizer.decode(actions)
    if text.startswith("A") and text.endswith(TURN_END):
      return state, np.zeros(0, np.int32), float(text[1:-1] == state.answer), True
    if state.pages_read == self.config.n_pages:
      return state, self._ids("E;"), 0.0, False
    page = page_text(state.seed, state.pages_read, self.config)
    return state._replace(pages_read=state.pages_read + 1), self._ids(page), 0.0, False

  def anchor(self, state: _State) -> int:
    """A turn's state: the pages read so far."""
    return state.pages_read

  def _ids(self, text: str) -> np.ndarray:
    return np.asarray(self.tokenizer.encode(text), np.int32)


class LogLookup(builders.ProceduralBuilder):
  """The TFDS builder of log_lookup: a key to find in a log read a page at a time."""

  make_example = staticmethod(make_example)
  FEATURES = {
      "prompt": tfds.features.Text(),
      "completion": tfds.features.Text(),
      "answer": tfds.features.Text(),
      "seed": tfds.features.Scalar(np.int64),
      "page": tfds.features.Scalar(np.int64),
  }
  BUILDER_CONFIGS = [
      builders.ProceduralConfig(name="p4", task=LogLookupConfig(),
                                description="4 pages of 16 records"),
  ]


def train_task(config, *, data_dir: str, seed: int,
               tokenizer: str | None = None) -> task.TrainTask:
  """log_lookup bound to its data: a multi-turn task whose rewards come from `LogLookupEnv`
  (RL only: no demonstrations).

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
  options = task.options_of(LogLookupConfig, config)
  characters = CharTokenizer(ALPHABET)
  return procedural.character_environment_task(
      "log_lookup", config, options, characters, LogLookupEnv(options, characters),
      turn_end=TURN_END, data_dir=data_dir, seed=seed)


TASK = task.register(task.Task(name="log_lookup", options=LogLookupConfig, data=LogLookup,
                               train=train_task))
