"""Exact policy metrics on held-out prompts, from the V^pi(x) of the exact oracle the task
registers (`tasks.Task.oracle.held_out_success`: key_token, target_sum, key_turns).

  hook = exact_metrics.hook(every=10)            # a rollout hook for jaxcredit.train.loop.run
  curve = exact_metrics.read_curve(run_dir)      # what it logged, against generated tokens

With p(x) = V^pi(x) the exact success probability of prompt x:

  J(pi)  = mean_x p(x)                            expected success, no sampling noise
  pass@k = mean_x [1 - (1 - p(x))^k]              a sample of k responses holds a success

measured on the task's test split every `every` updates (before update t: the policy after
t updates), against the tokens generated before that update. Summaries of a curve:
`tokens_to_reach` (first crossing of a level, interpolated in log tokens or linearly) and
`auc_log_tokens` (mean J over log10 generated tokens on a common range).
"""

import json
import pathlib
from collections.abc import Sequence

import numpy as np

from jaxcredit import tasks
from jaxcredit.credit import extras

PASS_AT = (1, 4, 16, 64)
METRIC = "train/hook/exact_success"


def pass_at_k(success: np.ndarray, k: int) -> float:
  """Exact pass@k of per-prompt success probabilities: ``mean_x 1 - (1 - p(x))^k``.

  Args:
    success: ``[n]`` per-prompt success probabilities p(x).
    k: attempts per prompt.

  Returns:
    a float in [0, 1].

  Examples:
    >>> from jaxcredit.lab import exact_metrics
    >>> exact_metrics.pass_at_k([0.5, 1.0], k=2)
    0.875
  """
  return float(np.mean(1.0 - (1.0 - np.asarray(success, np.float64)) ** k))


def hook(every: int, ks: Sequence[int] = PASS_AT) -> extras.Hook:
  """A rollout hook logging exact_success (J) and exact_pass@k over the task's test split (read
  once).

  Args:
    every: measure when rl_step is a multiple of it.
    ks: the k of the pass@k logged.

  Returns:
    ``hook(context, rollout) -> ({}, metrics)``, for ``loop.run(rollout_hook=)``.
  """
  held_out = {}

  def measure(context: extras.Context, rollout) -> tuple[dict, dict]:
    del rollout
    if context.rl_step % every:
      return {}, {}
    if not held_out:
      test = context.task.sources["test"]
      held_out["examples"] = [test[i] for i in range(len(test))]
    oracle = tasks.get(context.task.name).oracle
    success = oracle.held_out_success(context.model, context.task.config, held_out["examples"])
    return {}, {"exact_success": float(np.mean(success)),
                **{f"exact_pass@{k}": pass_at_k(success, k) for k in ks}}

  return measure


def read_curve(run_dir: pathlib.Path) -> dict:
  """A run's exact-success curve from its metrics.jsonl.

  Args:
    run_dir: the run's directory.

  Returns:
    ``{"updates", "success", "pass@k": {k: [...]}, "gen_tokens", "zero_variance_groups"}``:
    the hook's measurements after that many updates, the tokens generated before them (the
    records before the measuring step), and the mean fraction of zero-variance groups over
    the run.
  """
  records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
  rl = [r for r in records if "train/gen_tokens" in r]
  curve = {"updates": [], "success": [], "pass@k": {}, "gen_tokens": []}
  for index, record in enumerate(rl):
    if METRIC in record:
      curve["updates"].append(index)
      curve["success"].append(record[METRIC])
      curve["gen_tokens"].append(rl[index - 1]["train/gen_tokens"] if index else 0)
      for key, value in record.items():
        if key.startswith("train/hook/exact_pass@"):
          curve["pass@k"].setdefault(key.rsplit("@", 1)[1], []).append(value)
  zero_variance = [r["train/zero_variance_groups"] for r in rl if "train/zero_variance_groups" in r]
  curve["zero_variance_groups"] = float(np.mean(zero_variance)) if zero_variance else None
  return curve


def tokens_to_reach(tokens, success, level: float, *, log_scale: bool = True) -> float | None:
  """The generated tokens (or updates) at which a success curve first reaches a level,
  interpolated linearly in log10 tokens between measurements (the first measurement, at 0
  tokens, counts as is), or linearly in tokens with ``log_scale=False``.

  Args:
    tokens: the generated tokens (or updates) at each measurement.
    success: J at each measurement.
    level: the level to reach.
    log_scale: interpolate in log10 tokens; linearly otherwise.

  Returns:
    the tokens, or None if the curve never reaches `level`.

  Examples:
    >>> from jaxcredit.lab import exact_metrics
    >>> round(exact_metrics.tokens_to_reach([0, 100, 1000], [0.1, 0.2, 0.6], 0.4), 1)  # 10**2.5
    316.2
    >>> round(exact_metrics.tokens_to_reach([0, 100, 1000], [0.1, 0.2, 0.6], 0.4,
    ...                                     log_scale=False), 1)
    550.0
  """
  tokens, success = np.asarray(tokens, float), np.asarray(success, float)
  for i, value in enumerate(success):
    if value >= level:
      if i == 0 or (log_scale and tokens[i - 1] <= 0):
        return float(tokens[i])
      fraction = (level - success[i - 1]) / (value - success[i - 1])
      if not log_scale:
        return float(tokens[i - 1] + fraction * (tokens[i] - tokens[i - 1]))
      log_tokens = np.log10(tokens[i - 1]) + fraction * np.log10(tokens[i] / tokens[i - 1])
      return float(10 ** log_tokens)
  return None


def auc_log_tokens(tokens, success, low: float, high: float) -> float:
  """The mean of J over log10 generated tokens on [low, high]: the trapezoid integral of the
  curve (interpolated in log tokens, held at its last value after its last measurement, and
  at its value at `low` before it) divided by log10(high / low).

  Args:
    tokens: the generated tokens at each measurement.
    success: J at each measurement.
    low: the window's start, > 0.
    high: the window's end, > low.

  Returns:
    a float in [0, 1] for J in [0, 1].
  """
  tokens, success = np.asarray(tokens, float), np.asarray(success, float)
  grid = np.log10(np.geomspace(low, high, 512))
  positive = tokens > 0
  values = np.interp(grid, np.log10(tokens[positive]), success[positive])
  return float(np.trapezoid(values, grid) / (grid[-1] - grid[0]))
