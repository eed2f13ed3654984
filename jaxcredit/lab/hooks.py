"""Rollout hooks that give model- or rollout-based estimators their inputs
inside the training loop (`jaxcredit.train.loop.run(..., rollout_hook=...)`).

  vineppo            K Monte-Carlo continuations per evaluated position ->
                     extras["mc_values"], extras["mc_evaluated"] (charged to gen_tokens)
  oracle, oracle_seq exact credit on filler-blind key_token ->
                     extras["oracle_advantages"], extras["oracle_values"] (not charged:
                     the oracle is an upper bound on information, LAB.md 4.3)
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxcredit.lab import oracle
from jaxcredit.train import tasks
from jaxcredit.train.loop import RolloutHook

MC_ESTIMATORS = ("vineppo",)
ORACLE_ESTIMATORS = ("oracle", "oracle_seq")


def estimator_settings(config: str | Mapping[str, Any]) -> dict[str, dict]:
  """{name: hyperparameters} of every estimator in a (nested) advantage config."""
  if isinstance(config, str):
    return {config: {}}
  config = dict(config)
  found = {}
  for part in config.get("sum", []):
    found.update(estimator_settings(part if isinstance(part, str) else
                                    {k: v for k, v in dict(part).items() if k != "weight"}))
  if "of" in config:
    found.update(estimator_settings(config["of"]))
  if "name" in config:
    found[config["name"]] = {k: v for k, v in config.items() if k != "name"}
  return found


def exact_credit(model, task: tasks.TrainTask, tokens, mask, examples) -> oracle.OracleCredit:
  """The exact oracle for `task` (filler-blind key_token)."""
  if task.name != "key_token":
    raise ValueError(f"An exact oracle exists for key_token only, not {task.name!r}; use vineppo (Monte Carlo).")
  targets = np.stack([np.asarray(e["targets"]) for e in examples])
  return oracle.decisive_credit(model, task.config, tokens, mask, targets)


def credit_hook(advantage: str | Mapping[str, Any], *, temperature: float = 1.0) -> RolloutHook | None:
  """A hook computing the extras `advantage` needs, or None if it needs none."""
  settings = estimator_settings(advantage)
  mc = next((settings[name] for name in MC_ESTIMATORS if name in settings), None)
  needs_oracle = any(name in settings for name in ORACLE_ESTIMATORS)
  if mc is None and not needs_oracle:
    return None

  def hook(task, model, rollout, examples, key, rl_step):
    del rl_step
    tokens, mask = np.asarray(rollout.tokens), np.asarray(rollout.mask)
    extras, metrics = {}, {}
    if mc is not None:
      credit = oracle.mc_credit(model, task, tokens, mask, np.asarray(rollout.extras["token_valid"]), examples, key,
                                k=int(mc.get("k", 4)), positions=str(mc.get("positions", "all")),
                                logprobs=np.asarray(rollout.logprobs), temperature=temperature)
      extras.update(mc_values=credit.values, mc_evaluated=credit.evaluated)
      metrics.update(gen_tokens=credit.cost["gen_tokens"], mc_rollouts=credit.cost["rollouts"])
    if needs_oracle:
      credit = exact_credit(model, task, tokens, mask, examples)
      extras.update(oracle_advantages=credit.advantages, oracle_values=credit.values)
      metrics.update(oracle_passes=credit.cost["passes"])
    return extras, metrics

  return hook
