"""`key_token`: a credit-assignment probe where a few known positions decide the
reward and the rest is filler (an exact task of the credit lab, `jaxcredit.lab`).

Token ids (V = 32): 0 PAD, 1 BOS, 2 SEP, 3 EOS, 4 FILL (input placeholder,
never an action), 5-12 key symbols K0..K7 (the alphabet C is the first
n_keys), 13-28 filler symbols F0..F15 (F is the first n_fillers; with
shared_alphabet F := C), 29-31 reserved.

Prompt `[BOS, c_1..c_K, SEP]` (key_fn="copy") or `[BOS, u_1..u_K, SEP]` with
c_k = (u_k + k) mod |C| (key_fn="shift"). The response has exactly T tokens;
the decisive positions P = {p_1 < ... < p_K} are placed "spread"
(p_k = floor(k T / (K + 1))), "early" (p_k = k - 1) or "late"
(p_k = T - K + k - 1). Reward rules on y_P::

  all     R = prod_k 1[y_{p_k} = c_k]
  count   R = mean_k 1[y_{p_k} = c_k]
  modsum  R = 1[sum_k (y_{p_k} - c_k) = 0 mod |C|]

`noise` flips a binary reward with probability eps (`noisy`).
"""

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from jaxcredit import _checks
from jaxcredit.sampling import Actions
from jaxcredit.tasks import builders, loader, procedural, task

PAD, BOS, SEP, EOS, FILL = 0, 1, 2, 3, 4
KEY0, FILLER0 = 5, 13
VOCAB_SIZE = 32
PLACEMENTS = ("spread", "early", "late")
RULES = ("all", "count", "modsum")


@dataclasses.dataclass(frozen=True)
class KeyTokenConfig:
  """The key_token probe's settings (module docstring).

  Attributes:
    length: the response length T.
    n_decisive: K, the decisive positions.
    n_keys: |C| <= 8.
    n_fillers: |F| <= 16.
    placement: "spread", "early" or "late".
    rule: "all", "count" or "modsum".
    key_fn: "copy" or "shift".
    noise: the reward flip probability.
    constrained: restrict actions to C at P and F elsewhere.
    filler_blind: hide filler from later inputs.
    shared_alphabet: F := C.
  """

  length: int = 8
  n_decisive: int = 2
  n_keys: int = 3
  n_fillers: int = 2
  placement: str = "spread"
  rule: str = "all"
  key_fn: str = "copy"
  noise: float = 0.0
  constrained: bool = True
  filler_blind: bool = False
  shared_alphabet: bool = False

  def __post_init__(self):
    checks = [
        (1 <= self.n_decisive <= min(4, self.length),
         f"n_decisive must be in [1, min(4, length)], got {self.n_decisive}"),
        (2 <= self.n_keys <= 8, f"n_keys must be in [2, 8], got {self.n_keys}"),
        (1 <= self.n_fillers <= 16, f"n_fillers must be in [1, 16], got {self.n_fillers}"),
        (self.placement in PLACEMENTS,
         f"Unknown placement {self.placement!r}; known: {', '.join(PLACEMENTS)}"),
        (self.rule in RULES, f"Unknown rule {self.rule!r}; known: {', '.join(RULES)}"),
        (self.key_fn in ("copy", "shift"), f"Unknown key_fn {self.key_fn!r}; known: copy, shift"),
        (0.0 <= self.noise < 0.5, f"noise must be in [0, 0.5), got {self.noise}"),
    ]
    _checks.require(checks)

  @property
  def keys(self) -> np.ndarray:
    """Token ids of the key alphabet C."""
    return np.arange(KEY0, KEY0 + self.n_keys)

  @property
  def fillers(self) -> np.ndarray:
    """Token ids of the filler alphabet F."""
    return self.keys if self.shared_alphabet else np.arange(FILLER0, FILLER0 + self.n_fillers)

  @property
  def decisive_positions(self) -> np.ndarray:
    """P, as response positions in [0, T)."""
    k = np.arange(1, self.n_decisive + 1)
    if self.placement == "spread":
      return (k * self.length) // (self.n_decisive + 1)
    if self.placement == "early":
      return k - 1
    return self.length - self.n_decisive + k - 1

  @property
  def prompt_length(self) -> int:
    return self.n_decisive + 2


def token_names(ids) -> list[str]:
  """The readable name of each token id: PAD BOS SEP EOS FILL, K0..K7, F0..F15, R29..R31.

  Args:
    ids: int ids, any shape.

  Returns:
    the names, flattened.

  Raises:
    ValueError: on ids outside the vocabulary.

  Examples:
    >>> from jaxcredit.tasks import key_token
    >>> key_token.token_names([1, 5, 13])
    ['BOS', 'K0', 'F0']
  """
  specials = ("PAD", "BOS", "SEP", "EOS", "FILL")
  names = [*specials, *(f"K{i}" for i in range(FILLER0 - KEY0)),
           *(f"F{i}" for i in range(16)), *(f"R{i}" for i in range(FILLER0 + 16, VOCAB_SIZE))]
  ids = np.asarray(ids)
  if ids.size and (ids.min() < 0 or ids.max() >= VOCAB_SIZE):
    raise ValueError(f"Token ids must be in [0, {VOCAB_SIZE}), got {ids.min()}..{ids.max()}.")
  return [names[i] for i in ids.tolist()]


def allowed(config: KeyTokenConfig) -> np.ndarray:
  """The actions allowed at each response position: keys at the decisive positions and filler
  elsewhere when constrained, any key or filler otherwise.

  Args:
    config: the task's `KeyTokenConfig`.

  Returns:
    bool ``[T, V]``.
  """
  table = np.zeros((config.length, VOCAB_SIZE), bool)
  if config.constrained:
    table[:, config.fillers] = True
    table[config.decisive_positions] = False
    table[np.ix_(config.decisive_positions, config.keys)] = True
  else:
    table[:, np.union1d(config.keys, config.fillers)] = True
  return table


def allowed_in_rows(config: KeyTokenConfig) -> np.ndarray:
  """`allowed` over whole rows, the prompt columns allowing every token.

  Args:
    config: the task's `KeyTokenConfig`.

  Returns:
    bool ``[K + 2 + T, V]``.
  """
  return np.concatenate([np.ones((config.prompt_length, VOCAB_SIZE), bool), allowed(config)])


def observe(responses: np.ndarray, config: KeyTokenConfig) -> np.ndarray:
  """The model's view of responses: FILL off the decisive positions when filler_blind.

  Args:
    responses: ``[..., T]`` int.
    config: the task's `KeyTokenConfig`.

  Returns:
    int ``[..., T]``.
  """
  if not config.filler_blind:
    return responses
  hidden = np.ones(config.length, bool)
  hidden[config.decisive_positions] = False
  return np.where(hidden, FILL, responses)


def make_example(rng: np.random.Generator, config: KeyTokenConfig) -> dict:
  """One key_token example.

  Args:
    rng: the NumPy generator.
    config: the task's `KeyTokenConfig`.

  Returns:
    ``{"prompt" [K + 2] ids, "targets" [K] key ids c_k, "decisive" [K] positions,
    "completion" [T] a demonstration with reward 1}``.
  """
  symbols = rng.integers(0, config.n_keys, config.n_decisive)
  if config.key_fn == "copy":
    targets = symbols
  else:
    targets = (symbols + np.arange(1, config.n_decisive + 1)) % config.n_keys
  completion = rng.choice(config.fillers, config.length)
  completion[config.decisive_positions] = KEY0 + targets
  return {
      "prompt": np.concatenate([[BOS], KEY0 + symbols, [SEP]]).astype(np.int32),
      "targets": (KEY0 + targets).astype(np.int32),
      "decisive": config.decisive_positions.astype(np.int32),
      "completion": completion.astype(np.int32),
  }


def reward(responses: np.ndarray, targets: np.ndarray, config: KeyTokenConfig) -> np.ndarray:
  """The rule reward of responses against their target keys.

  Args:
    responses: ``[B, T]`` int.
    targets: ``[B, K]`` target key ids.
    config: the task's `KeyTokenConfig`.

  Returns:
    float32 ``[B]``.

  Raises:
    ValueError: on shapes other than ``[B, T]`` and ``[B, K]``.
  """
  responses, targets = np.atleast_2d(responses), np.atleast_2d(targets)
  if responses.shape[1] != config.length or targets.shape[1] != config.n_decisive:
    raise ValueError(
        f"Expected responses [B, {config.length}] and targets [B, {config.n_decisive}], got "
        f"{responses.shape} and {targets.shape}."
    )
  return rule_reward(responses[:, config.decisive_positions], targets, config)


def rule_reward(picked, targets, config: KeyTokenConfig):
  """The rule's reward of the decisive tokens against the target key ids (all, count or modsum).
  NumPy or JAX arrays (traceable).

  Args:
    picked: ``[..., K]`` the decisive tokens.
    targets: ``[..., K]`` the target key ids.
    config: the task's `KeyTokenConfig`.

  Returns:
    float32 ``[...]``.
  """
  hits = picked == targets
  if config.rule == "all":
    return hits.all(axis=-1).astype(np.float32)
  if config.rule == "count":
    return hits.mean(axis=-1).astype(np.float32)
  offsets = (picked - targets).sum(axis=-1) % config.n_keys
  valid_keys = ((picked >= KEY0) & (picked < KEY0 + config.n_keys)).all(axis=-1)
  return ((offsets == 0) & valid_keys).astype(np.float32)


def explain(responses: np.ndarray, targets: np.ndarray, config: KeyTokenConfig) -> list[str]:
  """Per-response reasons: which decisive positions hold the right key.

  Args:
    responses: ``[B, T]`` int.
    targets: ``[B, K]`` target key ids.
    config: the task's `KeyTokenConfig`.

  Returns:
    one reason per response.
  """
  responses, targets = np.atleast_2d(responses), np.atleast_2d(targets)
  picked = responses[:, config.decisive_positions]
  return [
      "hits " + ", ".join(f"p={p}:{'ok' if got == want else f'{got}!={want}'}"
                          for p, got, want in zip(config.decisive_positions, row, target))
      for row, target in zip(picked, targets)
  ]


def noisy(rewards: np.ndarray, rng: np.random.Generator, config: KeyTokenConfig) -> np.ndarray:
  """Binary rewards flipped with probability config.noise (exact value eps + (1 - 2 eps) R).

  Args:
    rewards: ``[B]`` 0/1 rewards.
    rng: the NumPy generator.
    config: the task's `KeyTokenConfig`.

  Returns:
    float32 ``[B]``.
  """
  flips = rng.random(rewards.shape) < config.noise
  return np.where(flips, 1.0 - rewards, rewards).astype(np.float32)


class KeyToken(builders.ProceduralBuilder):
  """The TFDS builder of key_token, a token-level credit probe (ids, not text)."""

  make_example = staticmethod(make_example)
  FEATURES = {
      "prompt": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "targets": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "decisive": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "completion": tfds.features.Tensor(shape=(None,), dtype=np.int32),
  }
  BUILDER_CONFIGS = [
      builders.ProceduralConfig(name="t8_k2_all", task=KeyTokenConfig(),
                                description="T=8, K=2, |C|=3, |F|=2, spread, rule all"),
      builders.ProceduralConfig(
          name="t24_k2_blind",
          task=KeyTokenConfig(length=24, n_keys=4, n_fillers=4, filler_blind=True),
          description="T=24, K=2, |C|=4, |F|=4, filler-blind",
      ),
  ]


def row_actions(config: KeyTokenConfig) -> Actions:
  """The typed actions over whole rows: keys at the decisive positions, filler elsewhere
  (`allowed`), filler hidden from later inputs when filler_blind; the prompt is always seen.

  Args:
    config: the task's `KeyTokenConfig`.

  Returns:
    the `Actions`.
  """
  hidden = observe(np.zeros(config.length, np.int32), config) == FILL
  hidden_in_rows = np.concatenate([np.zeros(config.prompt_length, bool), hidden])
  return Actions(allowed=allowed_in_rows(config),
                 hidden=hidden_in_rows if hidden.any() else None, hidden_token=FILL)


def train_task(config, *, data_dir: str, seed: int,
               tokenizer: str | None = None) -> task.TrainTask:
  """key_token bound to its data: ids, exactly T actions per response, `row_actions`.

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
  options = task.options_of(KeyTokenConfig, config)

  def score(tokens, mask, examples):
    del mask  # every response has exactly T actions
    targets = np.stack([np.asarray(e["targets"]) for e in examples])
    return reward(tokens, targets, options)

  return task.TrainTask(
      vocab_size=VOCAB_SIZE, pad_id=PAD, stop_tokens=(), max_prompt_length=options.prompt_length,
      max_response_length=options.length, encode=loader.ids_encoder, score=score,
      actions=row_actions(options), token_texts=token_names,
      **procedural.fields("key_token", config, options, data_dir=data_dir, seed=seed))
