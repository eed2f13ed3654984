"""Exact token credit on key_token under any policy, at temperature 1: E-DEC
(`decisive`, filler-blind key_token) and E-TREE (`tree`, filler visible or not).

The oracle the training loop and the credit lab read (`tasks.Task.oracle`): `no_exact_oracle`,
`exact_extras` (E-DEC on sampled rows) and `held_out_success` (V(x) of held-out prompts).
"""

import numpy as np

from jaxcredit.tasks import exact
from jaxcredit.tasks.key_token import definition as key_token
from jaxcredit.tasks.key_token.oracle import decisive, tree
from jaxcredit.tasks.key_token.oracle.decisive import (credit_from_values, decisive_credit,
                                                       decisive_distributions, decisive_values,
                                                       exact_success, key_distribution, not_exact)
from jaxcredit.tasks.key_token.oracle.tree import (MAX_PASSES, credit_from_tree, passes_per_prompt,
                                                   tree_credit, value_tree)

__all__ = ["MAX_PASSES", "credit_from_tree", "credit_from_values", "decisive", "decisive_credit",
           "decisive_distributions", "decisive_values", "exact_extras", "exact_success",
           "held_out_success", "key_distribution", "no_exact_oracle", "not_exact",
           "passes_per_prompt", "tree", "tree_credit", "value_tree"]


def no_exact_oracle(config: key_token.KeyTokenConfig) -> str | None:
  """Why a training run on this task under `config` has no exact oracle.

  Args:
    config: the task's `KeyTokenConfig`.

  Returns:
    the reason and what to do instead, or None when it has one.
  """
  reason = not_exact(config)
  return (f"{reason}: set task.options filler_blind=True and constrained=True, or use vineppo "
          "(Monte Carlo).") if reason else None


def exact_extras(model, config: key_token.KeyTokenConfig, rollout, examples) -> tuple[dict, dict]:
  """The exact credit of a training rollout, as rollout extras: E-DEC (`decisive_credit`).

  Args:
    model: the policy that sampled the rollout.
    config: the task's `KeyTokenConfig`.
    rollout: the sampled `Rollout`.
    examples: the task example of each row.

  Returns:
    ``({"oracle_advantages", "oracle_values"} [B, L], {"oracle_passes"})``.

  Raises:
    ValueError: when the options have no exact oracle.
  """
  targets = np.stack([np.asarray(e["targets"]) for e in examples])
  return exact.as_extras(decisive_credit(model, config, np.asarray(rollout.tokens),
                                         np.asarray(rollout.mask), targets))


def held_out_success(model, config: key_token.KeyTokenConfig, examples) -> np.ndarray:
  """The exact success probability V(x) of each held-out example (`exact_success`).

  Args:
    model: the policy.
    config: the task's `KeyTokenConfig`.
    examples: the held-out examples.

  Returns:
    float64 ``[n]``.
  """
  return exact_success(model, config, np.stack([e["prompt"] for e in examples]),
                       np.stack([e["targets"] for e in examples]))
