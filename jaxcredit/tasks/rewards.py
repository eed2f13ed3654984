"""Verifiable rewards: each returns (reward, reason) per response; `batched`
maps one over a batch for the training loop."""

import re
from collections.abc import Callable, Sequence

import numpy as np

RewardFn = Callable[..., tuple[float, str]]


def exact_match(got: str | None, want: str) -> tuple[float, str]:
  """1.0 when the extracted answer `got` equals `want`, else 0.0; with a reason."""
  if got is None:
    return 0.0, "no answer"
  if got == want:
    return 1.0, "correct"
  return 0.0, f"wrong answer {got!r} (want {want!r})"


def format_reward(response: str, pattern: str = r"(?s).*<answer>.+</answer>\s*") -> tuple[float, str]:
  """1.0 when the whole response matches `pattern` (default: ends with an
  `<answer>...</answer>` span, the R1 / TinyZero format), else 0.0."""
  if re.fullmatch(pattern, response):
    return 1.0, "well-formatted"
  return 0.0, f"does not match {pattern!r}"


def batched(reward_fn: RewardFn, responses: Sequence[str], *per_example: Sequence, **kwargs
            ) -> tuple[np.ndarray, list[str]]:
  """Applies reward_fn(response, *fields, **kwargs) to each example.

  Returns (rewards [B] float32, reasons [B]).
  """
  if any(len(field) != len(responses) for field in per_example):
    raise ValueError(
        f"Got {len(responses)} responses but per-example fields of lengths "
        f"{[len(f) for f in per_example]}."
    )
  results = [reward_fn(r, *fields, **kwargs) for r, *fields in zip(responses, *per_example)]
  return np.asarray([r for r, _ in results], np.float32), [reason for _, reason in results]
