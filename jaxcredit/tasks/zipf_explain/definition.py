"""`zipf_explain`: a language-like credit probe. A long "explanation" in a Zipfian bigram
grammar in which a few answer tokens, placed where the writer chooses, decide the reward.

Token ids (V = 64): 0 PAD, 1 BOS, 2 SEP, 3 EOS, 4 MARK ("therefore"), 5-12 key symbols
K0..K7 (the answers' alphabet C is the first n_keys), 13-60 words W0..W47 (the first
n_words), 61-63 reserved.

Prompt `[BOS, c_1..c_K, SEP]`. The response has exactly T tokens. Its text is words; the
k-th MARK announces the k-th answer, the token right after it. The reward is

  R = 1[exactly K MARKs, each followed by a key, no key elsewhere, and the k-th answer
        equal to c_k for every k]

so the decisive tokens are the answers, and the MARKs (how many, whether one is left room
for its answer): which columns they are differs from response to response. The words carry
no credit: R never reads them, but a policy conditions on them (every token is visible),
so they shape what it does at the answers.

The demonstrations (`make_example`, for the SFT that makes the regime) are what the writer
is taught: words from a bigram chain whose start and successor probabilities are Zipfian
(exponent `zipf_exponent` over a word's 1 to `branching` successors, fixed by
`grammar_seed`: some words determine the next, others leave it open, as in text), K MARKs at
random columns (spread, each with room for its answer) and answers right with probability
`key_accuracy`, else a uniform key.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxcredit import _checks

PAD, BOS, SEP, EOS, MARK = 0, 1, 2, 3, 4
KEY0, WORD0 = 5, 13
MAX_KEYS, MAX_WORDS = 8, 48
VOCAB_SIZE = 64


@dataclasses.dataclass(frozen=True)
class ZipfExplainConfig:
  """The zipf_explain task's settings (module docstring).

  Attributes:
    length: the response length T.
    n_answers: K answers that decide R (2..4).
    n_keys: |C|.
    n_words: the grammar's words.
    zipf_exponent: the Zipf law's exponent.
    branching: the most successors a word has.
    grammar_seed: the bigram grammar's seed.
  """

  length: int = 128
  n_answers: int = 2
  n_keys: int = 4
  n_words: int = 32
  zipf_exponent: float = 1.1
  branching: int = 6
  grammar_seed: int = 0

  def __post_init__(self):
    _checks.require([
        (1 <= self.n_answers <= 4, f"n_answers must be in [1, 4], got {self.n_answers}"),
        (self.length >= 2 * self.n_answers,
         f"length must be >= 2 n_answers = {2 * self.n_answers} (a MARK and its answer "
         f"each), got {self.length}"),
        (2 <= self.n_keys <= MAX_KEYS, f"n_keys must be in [2, {MAX_KEYS}], got {self.n_keys}"),
        (1 <= self.n_words <= MAX_WORDS,
         f"n_words must be in [1, {MAX_WORDS}], got {self.n_words}"),
        (1 <= self.branching <= self.n_words,
         f"branching must be in [1, n_words = {self.n_words}], got {self.branching}"),
        (self.zipf_exponent >= 0, f"zipf_exponent must be >= 0, got {self.zipf_exponent}"),
    ])

  @property
  def keys(self) -> np.ndarray:
    """Token ids of the answer alphabet C."""
    return np.arange(KEY0, KEY0 + self.n_keys)

  @property
  def words(self) -> np.ndarray:
    return np.arange(WORD0, WORD0 + self.n_words)

  @property
  def prompt_length(self) -> int:
    return self.n_answers + 2


def token_names(ids) -> list[str]:
  """The readable name of each token id: PAD BOS SEP EOS MARK, K0..K7, W0..W47, R61..R63.

  Args:
    ids: int ids, any shape.

  Returns:
    the names, flattened.

  Raises:
    ValueError: on ids outside the vocabulary.
  """
  names = ["PAD", "BOS", "SEP", "EOS", "MARK", *(f"K{i}" for i in range(MAX_KEYS)),
           *(f"W{i}" for i in range(MAX_WORDS)),
           *(f"R{i}" for i in range(WORD0 + MAX_WORDS, VOCAB_SIZE))]
  ids = np.asarray(ids)
  if ids.size and (ids.min() < 0 or ids.max() >= VOCAB_SIZE):
    raise ValueError(f"Token ids must be in [0, {VOCAB_SIZE}), got {ids.min()}..{ids.max()}.")
  return [names[i] for i in ids.tolist()]


def allowed(config: ZipfExplainConfig) -> np.ndarray:
  """The actions allowed in every response column: MARK, the keys and the words (the grammar is
  the policy's to learn, not a constraint).

  Args:
    config: the task's `ZipfExplainConfig`.

  Returns:
    bool ``[T, V]``.
  """
  table = np.zeros((config.length, VOCAB_SIZE), bool)
  table[:, [MARK, *config.keys, *config.words]] = True
  return table


def allowed_in_rows(config: ZipfExplainConfig) -> np.ndarray:
  """`allowed` over whole rows, the prompt columns allowing every token.

  Args:
    config: the task's `ZipfExplainConfig`.

  Returns:
    bool ``[P + T, V]``.
  """
  return np.concatenate([np.ones((config.prompt_length, VOCAB_SIZE), bool), allowed(config)])


def prompts(keys, config: ZipfExplainConfig):
  """The prompts ``[BOS, c_1..c_K, SEP]`` of the answers' key indices.

  Args:
    keys: ``[n, K]`` key indices (NumPy or JAX, traced or not; the result is the same kind).
    config: the task's `ZipfExplainConfig`.

  Returns:
    int32 ``[n, K + 2]``.
  """
  xp = np if isinstance(keys, np.ndarray) else jnp
  column = lambda token: xp.full((keys.shape[0], 1), token)
  return xp.concatenate([column(BOS), keys + KEY0, column(SEP)], axis=1).astype(np.int32)


def outcome(responses, targets, config: ZipfExplainConfig):
  """The reward of responses against the right answers' key indices. NumPy or JAX arrays
  (traceable).

  Args:
    responses: ``[..., T]`` token ids.
    targets: ``[..., K]`` the right key indices.
    config: the task's `ZipfExplainConfig`.

  Returns:
    float32 ``[...]``.
  """
  xp = np if isinstance(responses, np.ndarray) and isinstance(targets, np.ndarray) else jnp
  marks = responses == MARK
  after_mark = xp.concatenate([xp.zeros_like(marks[..., :1]), marks[..., :-1]], axis=-1)
  is_key = (responses >= KEY0) & (responses < KEY0 + config.n_keys)
  # The answer after the k-th MARK sits where the running count of MARKs before it is k.
  index = xp.cumsum(marks, axis=-1) - 1  # at an answer column: its k - 1
  right = xp.take_along_axis(targets, xp.clip(index, 0, config.n_answers - 1), axis=-1)
  answers_right = xp.all(~after_mark | (responses - KEY0 == right), axis=-1)
  # Keys exactly after the MARKs, and the last MARK leaves room for its answer.
  grammatical = xp.all(after_mark == is_key, axis=-1) & ~marks[..., -1]
  count_right = xp.sum(marks, axis=-1) == config.n_answers
  return (grammatical & count_right & answers_right).astype(np.float32)


def reward(responses: np.ndarray, prompts_: np.ndarray, config: ZipfExplainConfig) -> np.ndarray:
  """The reward of responses to their prompts.

  Args:
    responses: ``[B, T]`` token ids.
    prompts_: ``[B, K + 2]`` the prompts.
    config: the task's `ZipfExplainConfig`.

  Returns:
    float32 ``[B]``.

  Raises:
    ValueError: on shapes other than ``[B, T]`` and ``[B, K + 2]``.
  """
  responses, prompts_ = np.atleast_2d(responses), np.atleast_2d(prompts_)
  want = (config.length,), (config.prompt_length,)
  if responses.shape[1:] != want[0] or prompts_.shape[1:] != want[1] or (
      len(responses) != len(prompts_)):
    raise ValueError(f"Expected responses [B, {config.length}] and prompts "
                     f"[B, {config.prompt_length}], got {responses.shape} and {prompts_.shape}.")
  return outcome(responses, prompts_[:, 1:-1] - KEY0, config)


@functools.lru_cache(maxsize=16)
def grammar(config: ZipfExplainConfig) -> tuple[np.ndarray, np.ndarray]:
  """(start [W], successors [W, W]) float64 probabilities of the bigram chain over the
  words: the start Zipfian over a fixed shuffle of the words; each word's successors (1
  to `branching` of them, drawn by grammar_seed) Zipfian in a random order."""
  rng = np.random.default_rng(config.grammar_seed)
  w, b = config.n_words, config.branching
  zipf = lambda n: (weights := np.arange(1, n + 1) ** -config.zipf_exponent) / weights.sum()
  start = np.zeros(w)
  start[rng.permutation(w)] = zipf(w)
  successors = np.zeros((w, w))
  for word in range(w):
    count = rng.integers(1, b + 1)
    successors[word, rng.choice(w, count, replace=False)] = zipf(count)
  return start, successors


def make_example(rng: np.random.Generator, config: ZipfExplainConfig,
                 key_accuracy: float = 0.0) -> dict:
  """One zipf_explain example with a demonstration: words of the grammar, K MARKs at random
  columns (the k-th in the k-th of K equal spans of the response, with room for its answer),
  each answer right with probability key_accuracy, else a uniform key.

  Args:
    rng: the NumPy generator.
    config: the task's `ZipfExplainConfig`.
    key_accuracy: the probability of each demonstrated answer being right, in [0, 1].

  Returns:
    ``{"prompt" [K + 2], "target" [K] the right key indices, "completion" [T]}``.

  Raises:
    ValueError: for key_accuracy outside [0, 1].
  """
  _checks.check_in_range(key_accuracy, "key_accuracy", low=0.0, high=1.0)
  k, t = config.n_answers, config.length
  target = rng.integers(0, config.n_keys, k)
  start, successors = grammar(config)
  completion = np.empty(t, np.int64)
  word = rng.choice(config.n_words, p=start)
  for column in range(t):
    completion[column] = WORD0 + word
    word = rng.choice(config.n_words, p=successors[word])
  bounds = np.linspace(0, t, k + 1).astype(int)
  for i in range(k):
    column = rng.integers(bounds[i], bounds[i + 1] - 1)  # its answer stays in the span
    right = rng.random() < key_accuracy
    completion[column] = MARK
    completion[column + 1] = KEY0 + (target[i] if right else rng.integers(config.n_keys))
  return {"prompt": prompts(target[None], config)[0], "target": target,
          "completion": completion.astype(np.int32)}


def demonstrations(key, targets, config: ZipfExplainConfig, key_accuracy: float = 0.0):
  """Completions for the right key indices, drawn as `make_example` draws them (the same
  distribution, other draws). Traceable: the lab's SFT draws them inside its jit.

  Args:
    key: a PRNG key.
    targets: ``[n, K]`` the right key indices.
    config: the task's `ZipfExplainConfig`.
    key_accuracy: the probability of each demonstrated answer being right.

  Returns:
    int32 ``[n, T]``.
  """
  k, t = config.n_answers, config.length
  n = targets.shape[0]
  start, successors = (jnp.log(jnp.asarray(x, jnp.float32)) for x in grammar(config))
  keys = jax.random.split(key, 5)

  def next_word(word, step_key):
    following = jax.random.categorical(step_key, successors[word])
    return following, word

  first = jax.random.categorical(keys[0], start, shape=(n,))
  _, words = jax.lax.scan(next_word, first, jax.random.split(keys[1], t))
  completion = WORD0 + words.T  # [n, T]
  bounds = np.linspace(0, t, k + 1).astype(int)
  columns = jax.random.randint(keys[2], (n, k), bounds[:-1], bounds[1:] - 1)
  guess = jax.random.randint(keys[3], (n, k), 0, config.n_keys)
  right = jax.random.uniform(keys[4], (n, k)) < key_accuracy
  rows = jnp.arange(n)[:, None]
  completion = completion.at[rows, columns].set(MARK)
  completion = completion.at[rows, columns + 1].set(KEY0 + jnp.where(right, targets, guess))
  return completion.astype(jnp.int32)
