"""A run's data from its task: the budgets' checks, the held-out batch for greedy
evaluation, and noisy SFT demonstrations.

  lengths = {split: data.split_lengths(task, split) for split in task.sources}
  counts = data.check_data(task, lengths=lengths, max_dropped_fraction=0.1)
  batch = data.evaluation_batch(task, lengths["test"][:, 0])
  for chunk, rows in data.batch_chunks(batch, size): ...
"""

import numpy as np

from jaxcredit import tasks
from jaxcredit.tasks import loader


def noisy_demonstrations(tokens: np.ndarray, loss_mask: np.ndarray, rng: np.random.Generator, *,
                         rate: float, task: tasks.TrainTask) -> np.ndarray:
  """Replaces one completion token of a `rate` fraction of demonstrations by another allowed
  action (stop tokens kept), so SFT leaves an imperfect policy.

  Args:
    tokens: ``[n, L]`` int demonstrations.
    loss_mask: ``[n, L]`` bool, their completion tokens.
    rng: the NumPy generator.
    rate: the fraction of demonstrations changed.
    task: the `TrainTask` (its action sets, stop and pad ids).

  Returns:
    a changed copy of `tokens`.
  """
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


def split_lengths(task: tasks.TrainTask, split: str) -> np.ndarray:
  """The token counts of a split's examples.

  Args:
    task: the `TrainTask`.
    split: "train" or "test".

  Returns:
    int ``[n, 2]``: prompt and completion (with its stop token) lengths.
  """
  examples = _all_examples(task.sources[split])
  return np.asarray([[len(ids) for ids in task.encode(e)] for e in examples]).reshape(-1, 2)


def check_data(task: tasks.TrainTask, *, max_dropped_fraction: float,
               lengths: dict[str, np.ndarray] | None = None) -> dict:
  """Counts, per split, the examples the budgets exclude, and says so.

  dropped: prompt longer than max_prompt_length (the loader skips it); unrewardable:
  reference answer (with its stop token) longer than max_response_length, so a response can
  never both finish and be right (warned).

  Args:
    task: the `TrainTask`.
    max_dropped_fraction: the largest fraction of a split that may be dropped.
    lengths: ``{split: split_lengths(task, split)}`` when already read.

  Returns:
    ``{"data/<split>/examples" | "/dropped" | "/unrewardable": count}``.

  Raises:
    ValueError: when a split would lose more than `max_dropped_fraction` of its examples.
  """
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


def evaluation_batch(task: tasks.TrainTask, prompt_lengths=None, limit: int | None = None) -> dict:
  """Every test prompt that fits max_prompt_length exactly once, left-padded, with its example
  (for greedy evaluation).

  Args:
    task: the `TrainTask`.
    prompt_lengths: the test prompts' token counts when already read.
    limit: the first `limit` prompts only, or None.

  Returns:
    ``{"prompts", "prompt_valid", "examples"}``; ``len(batch["examples"])`` is how many.
  """
  source = loader.Loader(_all_examples(task.sources["test"]), encode=task.encode, batch_size=1,
                         max_prompt_length=task.max_prompt_length, pad_id=task.pad_id,
                         process_index=0, process_count=1, prompt_lengths=prompt_lengths)
  return source.every_prompt(limit)


def batch_chunks(batch: dict, size: int | None):
  """A batch's prompts in chunks of one shape (one compilation).

  Args:
    batch: from `evaluation_batch`.
    size: rows per chunk; None for one chunk.

  Yields:
    ``(chunk, rows)``: the chunk (the last padded to `size` with copies of its first row)
    and how many of its rows are real.
  """
  total = len(batch["examples"])
  size = size or total
  for start in range(0, total, size):
    rows = min(size, total - start)
    take = np.concatenate([np.arange(start, start + rows), np.full(size - rows, start)])
    yield {"prompts": batch["prompts"][take], "prompt_valid": batch["prompt_valid"][take],
           "examples": [batch["examples"][i] for i in take]}, rows
