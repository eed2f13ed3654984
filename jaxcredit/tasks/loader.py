"""Batches for RL (prompts repeated group_size times, contiguous) and SFT
(prompt + completion), from any random-access source (a TFDS data source,
a list of dicts).

The batch of global step s is a pure function of (seed, s): examples are read
in the order of a per-epoch permutation seeded by (seed, epoch), so a run that
resumes at step s sees exactly the batches it would have seen - nothing is
repeated or skipped - and each of `process_count` hosts takes its own
contiguous slice of every global batch.
"""

import dataclasses
from collections.abc import Callable, Sequence

import jax
import numpy as np

from jaxcredit.tasks.tokenizers import HFTokenizer, Tokenizer

Encoder = Callable[[dict], tuple[list[int], list[int]]]


def text_encoder(tokenizer: Tokenizer, *, eos: bool = True, instruction: str = "") -> Encoder:
  """An encoder of text examples: ``(BOS + prompt + instruction, completion [+ EOS])`` ids.

  Args:
    tokenizer: the task's `Tokenizer`.
    eos: end the completion with the EOS id.
    instruction: text appended to every prompt.

  Returns:
    ``encode(example) -> (prompt_ids, completion_ids)``.
  """

  def encode(example: dict) -> tuple[list[int], list[int]]:
    prompt = tokenizer.encode(as_text(example["prompt"]) + instruction,
                              add_bos=tokenizer.bos_id is not None)
    completion = tokenizer.encode(as_text(example["completion"]), add_eos=eos)
    return prompt, completion

  return encode


def as_text(value) -> str:
  """A TFDS text feature (bytes) or a str, as str.

  Args:
    value: bytes or any value.

  Returns:
    the text.
  """
  return value.decode() if isinstance(value, bytes) else str(value)


def chat_encoder(tokenizer: HFTokenizer, *, instruction: str = "", system_prompt: str | None = None,
                 template_variables: dict | None = None) -> Encoder:
  """An encoder of question-answer examples whose prompt is rendered by the tokenizer's chat
  template::

    [system_prompt?] + user: example["prompt"] + instruction, then the
    template's generation prompt (the assistant turn's header).

  The completion ends with the tokenizer's eos_token (an instruct model's end of turn).

  Args:
    tokenizer: an `HFTokenizer` with a chat template.
    instruction: text appended to the user's message.
    system_prompt: a system message, or None.
    template_variables: variables the template sees (e.g. ``{"enable_thinking": False}``
      for Qwen3).

  Returns:
    ``encode(example) -> (prompt_ids, completion_ids)``.
  """
  variables = dict(template_variables or {})

  def encode(example: dict) -> tuple[list[int], list[int]]:
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    user = [{"role": "user", "content": as_text(example["prompt"]) + instruction}]
    prompt = tokenizer.apply_chat_template(system + user, add_generation_prompt=True, **variables)
    return prompt, tokenizer.encode(as_text(example["completion"]), add_eos=True)

  return encode


def ids_encoder(example: dict) -> tuple[list[int], list[int]]:
  """The encoder of examples that already hold token ids (key_token).

  Args:
    example: ``{"prompt": ids, "completion": ids}``.

  Returns:
    ``(prompt_ids, completion_ids)`` as int lists.
  """
  return [int(t) for t in example["prompt"]], [int(t) for t in example["completion"]]


@dataclasses.dataclass
class Loader:
  """Deterministic, resumable, per-process batches from a source of examples.

  Attributes:
    source: random-access examples.
    encode: ``encode(example) -> (prompt_ids, completion_ids)``.
    batch_size: prompts (RL) or sequences (SFT) per *global* step.
    max_prompt_length: prompts are left-padded to it; longer ones are counted and dropped
      (overlong="drop", decided once over the whole source) or left-truncated
      (overlong="truncate", counted per batch).
    seed: the order's seed.
    process_index: this process's share; None for ``jax.process_index()``.
    process_count: the processes; None for ``jax.process_count()``.
    overlong: "drop" or "truncate".
    pad_id: the padding id.
    prompt_lengths: ``[len(source)]`` prompt token counts when already known (the drop
      decision then reads nothing; otherwise the source is encoded once).
  """

  source: Sequence[dict]
  encode: Encoder
  batch_size: int
  max_prompt_length: int
  seed: int = 0
  process_index: int | None = None  # default: jax.process_index()
  process_count: int | None = None  # default: jax.process_count()
  overlong: str = "drop"
  pad_id: int = 0
  prompt_lengths: Sequence[int] | None = None

  def __post_init__(self):
    if self.process_index is None:
      self.process_index = jax.process_index()
    if self.process_count is None:
      self.process_count = jax.process_count()
    if self.overlong not in ("drop", "truncate"):
      raise ValueError(f"Unknown overlong policy {self.overlong!r}; known: drop, truncate.")
    if self.batch_size % self.process_count:
      raise ValueError(
          f"batch_size {self.batch_size} is not divisible by process_count {self.process_count}."
      )
    if not 0 <= self.process_index < self.process_count:
      raise ValueError(f"process_index {self.process_index} not in [0, {self.process_count}).")
    self.indices = np.arange(len(self.source))
    self.dropped = 0
    if self.overlong == "drop":
      lengths = self.prompt_lengths
      if lengths is None:
        lengths = [len(self.encode(self.source[i])[0]) for i in self.indices]
      elif len(lengths) != len(self.source):
        raise ValueError(f"prompt_lengths has {len(lengths)} entries for a source of "
                         f"{len(self.source)} examples.")
      keep = np.asarray(lengths) <= self.max_prompt_length
      self.dropped = int(len(keep) - keep.sum())
      self.indices = self.indices[keep]
    if len(self.indices) == 0:
      raise ValueError("No example fits max_prompt_length; nothing to load.")

  def example_indices(self, step: int) -> np.ndarray:
    """Source indices of this process's share of global step `step`."""
    n = len(self.indices)
    per_process = self.batch_size // self.process_count
    start = step * self.batch_size + self.process_index * per_process
    positions = np.arange(start, start + per_process)
    epochs, offsets = positions // n, positions % n
    orders = {e: np.random.default_rng([self.seed, e]).permutation(n) for e in np.unique(epochs)}
    return self.indices[[orders[e][o] for e, o in zip(epochs, offsets)]]

  def _prompt(self, ids: list[int]) -> tuple[list[int], bool]:
    if len(ids) <= self.max_prompt_length:
      return ids, False
    return ids[-self.max_prompt_length:], True

  def rl_batch(self, step: int, *, group_size: int) -> dict:
    """Prompts [b * G, P] left-padded, each repeated G times contiguously;
    `examples` are the source examples in the same row order."""
    return self._prompt_batch(self.example_indices(step), group_size)

  def every_prompt(self, limit: int | None = None) -> dict:
    """`rl_batch` layout (group size 1) of every example kept (the first `limit`
    of them when given), each once, in source order (for evaluation)."""
    return self._prompt_batch(self.indices[:limit], 1)

  def _prompt_batch(self, indices: np.ndarray, group_size: int) -> dict:
    examples, prompts, truncated = [], [], 0
    for index in indices:
      example = self.source[int(index)]
      prompt, cut = self._prompt(self.encode(example)[0])
      truncated += cut
      examples += [example] * group_size
      prompts += [prompt] * group_size
    ids = np.full((len(prompts), self.max_prompt_length), self.pad_id, np.int32)
    valid = np.zeros(ids.shape, bool)
    for row, prompt in enumerate(prompts):
      ids[row, len(ids[row]) - len(prompt):] = prompt
      valid[row, len(ids[row]) - len(prompt):] = True
    return {"prompts": ids, "prompt_valid": valid, "examples": examples, "truncated": truncated}

  def sft_batch(self, step: int, *, length: int) -> dict:
    """tokens [b, length] (prompt left-padded to max_prompt_length, then the
    completion, right-padded); loss_mask marks completion tokens; token_valid
    marks real tokens. Completions longer than the space left are cut (counted)."""
    rows = len(self.example_indices(step))
    tokens = np.full((rows, length), self.pad_id, np.int32)
    loss_mask = np.zeros((rows, length), bool)
    token_valid = np.zeros((rows, length), bool)
    truncated = 0
    for row, index in enumerate(self.example_indices(step)):
      prompt, completion = self.encode(self.source[int(index)])
      prompt, cut = self._prompt(prompt)
      room = length - self.max_prompt_length
      truncated += cut or len(completion) > room
      completion = completion[:room]
      start = self.max_prompt_length - len(prompt)
      end = self.max_prompt_length + len(completion)
      tokens[row, start:end] = prompt + completion
      token_valid[row, start:end] = True
      loss_mask[row, self.max_prompt_length:end] = True
    return {
        "tokens": tokens,
        "loss_mask": loss_mask,
        "token_valid": token_valid,
        "truncated": truncated
    }
