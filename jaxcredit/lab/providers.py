"""The lab's exact oracle as an extras provider of the training loop.

Importing this module registers the provider of rollout.extras
["oracle_advantages"] and ["oracle_values"] (read by the `oracle` and
`oracle_seq` estimators) with `jaxcredit.train.extras`; the training loop
finds it through the "jaxcredit.extras" entry point, so `train` never imports
the lab. The oracle's teacher-forced passes are not charged to the run's
generated tokens: it is an upper bound on information (LAB.md 4.3).
"""

import numpy as np

from jaxcredit.lab import oracle
from jaxcredit.train import extras, tasks


def exact_credit(model, task: tasks.TrainTask, tokens, mask, examples) -> oracle.Credit:
  """The exact oracle for `task` (filler-blind key_token)."""
  if task.name != "key_token":
    raise ValueError(
        f"An exact oracle exists for key_token only, not {task.name!r}; use vineppo (Monte Carlo).")
  targets = np.stack([np.asarray(e["targets"]) for e in examples])
  return oracle.decisive_credit(model, task.config, np.asarray(tokens), np.asarray(mask), targets)


def _exact_oracle(context: extras.Context, rollout) -> tuple[dict, dict]:
  credit = exact_credit(context.model, context.task, rollout.tokens, rollout.mask, context.examples)
  return ({"oracle_advantages": credit.advantages, "oracle_values": credit.values},
          {"oracle_passes": credit.cost["passes"]})


def _at_temperature_one(temperature: float) -> extras.Provide:
  if temperature != 1.0:
    raise ValueError(
        f"The exact oracle is computed at temperature 1, not rl.temperature = {temperature}.")
  return _exact_oracle


extras.register("oracle_advantages", "oracle_values")(
    lambda settings, *, temperature: _at_temperature_one(temperature))
