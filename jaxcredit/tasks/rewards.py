"""Verifiable rewards: each returns (reward, reason) per response; `batched`
maps one over a batch for the training loop."""

import re
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

RewardFn = Callable[..., tuple[float, str]]


def exact_match(got: str | None, want: str) -> tuple[float, str]:
  """1.0 when the extracted answer equals the reference, else 0.0.

  Args:
    got: the extracted answer, or None when there is none.
    want: the reference answer.

  Returns:
    ``(reward, reason)``.

  Examples:
    >>> from jaxcredit.tasks import rewards
    >>> rewards.exact_match("42", "42"), rewards.exact_match(None, "42")
    ((1.0, 'correct'), (0.0, 'no answer'))
  """
  if got is None:
    return 0.0, "no answer"
  if got == want:
    return 1.0, "correct"
  return 0.0, f"wrong answer {got!r} (want {want!r})"


def last_answer_span(response: str, open_tag: str = "<answer>",
                     close_tag: str = "</answer>") -> str | None:
  """The text of the last ``<answer>...</answer>`` span, in linear time (two `rfind`: a
  non-greedy regex is quadratic on ``"<answer>" * n``).

  Args:
    response: the decoded response.
    open_tag: the span's opening tag.
    close_tag: the span's closing tag.

  Returns:
    the span's text, or None.

  Examples:
    >>> from jaxcredit.tasks import rewards
    >>> rewards.last_answer_span("<answer>1</answer> then <answer>2</answer>")
    '2'
  """
  end = response.rfind(close_tag)
  start = response.rfind(open_tag, 0, max(end, 0))
  if end < 0 or start < 0:
    return None
  return response[start + len(open_tag):end]


def format_reward(response: str, pattern: str | None = None) -> tuple[float, str]:
  """1.0 when the response is well-formatted, else 0.0.

  By default (pattern None) it must end, up to whitespace, with a non-empty
  ``<answer>...</answer>`` span (the R1 / TinyZero format), checked in linear time;
  otherwise the whole response must match the regex `pattern` (keep it free of nested or
  adjacent unbounded repeats: Python's regex backtracks).

  Args:
    response: the decoded response.
    pattern: a regex the whole response must match, or None.

  Returns:
    ``(reward, reason)``.
  """
  if pattern is not None:
    if re.fullmatch(pattern, response):
      return 1.0, "well-formatted"
    return 0.0, f"does not match {pattern!r}"
  stripped = response.rstrip()
  span = last_answer_span(stripped)
  if span and stripped.endswith("</answer>"):
    return 1.0, "well-formatted"
  return 0.0, "does not end with a non-empty <answer>...</answer> span"


class Scored(NamedTuple):
  """Rewards of a batch of responses.

  Attributes:
    rewards: ``[B]`` float32.
    reasons: ``[B]`` why each got its reward.
    failed: ``[B]`` bool, where the reward function raised (those responses are scored 0).
  """

  rewards: np.ndarray
  reasons: list[str]
  failed: np.ndarray


def batched(reward_fn: RewardFn, responses: Sequence[str], *per_example: Sequence,
            **kwargs) -> Scored:
  """Applies ``reward_fn(response, *fields, **kwargs)`` to each response.

  A reward function must never raise on model output; if one does, that response gets 0
  with the error as its reason and is marked `failed` (and a warning is issued), so one
  response cannot kill the batch and no failure goes uncounted.

  Args:
    reward_fn: ``reward_fn(response, *fields, **kwargs) -> (reward, reason)``.
    responses: the decoded responses.
    *per_example: per-example fields, each as long as `responses`.
    **kwargs: passed to every call.

  Returns:
    `Scored(rewards, reasons, failed)`.

  Raises:
    ValueError: when a per-example field's length differs from the responses'.
  """
  if any(len(field) != len(responses) for field in per_example):
    raise ValueError(
        f"Got {len(responses)} responses but per-example fields of lengths "
        f"{[len(f) for f in per_example]}."
    )
  results = [
      _guarded(reward_fn, r, *fields, **kwargs) for r, *fields in zip(responses, *per_example)
  ]
  return Scored(np.asarray([r for r, _, _ in results], np.float32),
                [reason for _, reason, _ in results],
                np.asarray([failed for _, _, failed in results], bool))


def _guarded(reward_fn: RewardFn, response: str, *fields, **kwargs) -> tuple[float, str, bool]:
  try:
    return (*reward_fn(response, *fields, **kwargs), False)
  except Exception as error:  # noqa: BLE001 - model output must never stop training
    reason = f"reward function raised {type(error).__name__}: {error}"
    warnings.warn(f"{getattr(reward_fn, '__name__', reward_fn)}: {reason}; scored 0.",
                  RuntimeWarning, stacklevel=3)
    return 0.0, reason, True


class FailureCount:
  """Responses whose reward function raised, counted across threads until `take`.

  Examples:
    >>> import numpy as np
    >>> from jaxcredit.tasks import rewards
    >>> failures = rewards.FailureCount()
    >>> failures.add(rewards.Scored(np.zeros(2), ["raised", "ok"], np.array([True, False])))
    >>> failures.take()[:2]
    (1, 2)
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._failed = self._scored = 0
    self._reason = None

  def add(self, scored: Scored) -> None:
    with self._lock:
      self._failed += int(scored.failed.sum())
      self._scored += len(scored.failed)
      if self._reason is None and scored.failed.any():
        self._reason = scored.reasons[int(np.argmax(scored.failed))]

  def take(self) -> tuple[int, int, str | None]:
    """(failed, scored, the first failure's reason) since the last take; resets them."""
    with self._lock:
      counts = (self._failed, self._scored, self._reason)
      self._failed = self._scored = 0
      self._reason = None
    return counts
