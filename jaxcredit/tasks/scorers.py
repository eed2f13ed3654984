"""A task's `score` built from a reward on text: responses decoded, then scored.

  score = scorers.text_scorer(tokenizer, reward_fn, failures)      # [B] rewards
  score_components = scorers.text_components(tokenizer, components_fn)  # [B, K] components
  score = scorers.environment_rewards(name)   # multi-turn: rewards come from the environment
"""

import warnings
from collections.abc import Callable, Sequence

import numpy as np

from jaxcredit.rollout_sources import Scorer
from jaxcredit.tasks import rewards
from jaxcredit.tasks.tokenizers import Tokenizer


def _decoded(tokenizer: Tokenizer, tokens, mask) -> list[str]:
  """Each row's response text: its tokens where `mask` holds, decoded."""
  return [tokenizer.decode(row[m]) for row, m in zip(tokens, mask)]


def text_components(tokenizer: Tokenizer,
                    components_fn: Callable[[str, dict], Sequence[float]]) -> Scorer:
  """Decoded responses mapped to their reward components.

  Args:
    tokenizer: the task's tokenizer.
    components_fn: ``components_fn(response, example) -> [K]`` floats; it must not raise
      on model output.

  Returns:
    ``score(tokens, mask, examples) -> [B, K]`` float32.
  """

  def score(tokens, mask, examples):
    return np.asarray([components_fn(r, e) for r, e in zip(_decoded(tokenizer, tokens, mask),
                                                           examples)], np.float32)

  return score


def text_scorer(tokenizer: Tokenizer, reward_fn: Callable[[str, dict], tuple[float, str]],
                failures: rewards.FailureCount) -> Scorer:
  """Decoded responses scored by a text reward function (`rewards.batched`).

  Args:
    tokenizer: the task's tokenizer.
    reward_fn: ``reward_fn(response, example) -> (reward, outcome)``.
    failures: counts the responses on which `reward_fn` raises (they score 0).

  Returns:
    ``score(tokens, mask, examples) -> [B]`` float rewards.
  """
  def score(tokens, mask, examples):
    responses = _decoded(tokenizer, tokens, mask)
    with warnings.catch_warnings():  # counted instead, and reported by the loop every time
      warnings.simplefilter("ignore", RuntimeWarning)
      scored = rewards.batched(reward_fn, responses, examples)
    failures.add(scored)
    return scored.rewards

  return score


def environment_rewards(name: str) -> Scorer:
  """The `score` of a multi-turn task, whose rewards come from its environment turn by turn.

  Args:
    name: the task's name.

  Returns:
    a `score` that raises ValueError (whole responses cannot be scored on their own, e.g.
    by Monte-Carlo continuations).
  """

  def score(tokens, mask, examples):
    raise ValueError(f"Task {name!r} is multi-turn: its rewards come from its environment "
                     "(rollout_sources.MultiTurn), so whole responses cannot be scored on their "
                     "own (e.g. by Monte-Carlo continuations).")

  return score
