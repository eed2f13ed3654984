"""The lab's exact oracle as an extras provider of the training loop.

Importing this module registers the providers of rollout.extras
["oracle_advantages"] and ["oracle_values"] (read by the `oracle`, `oracle_seq`
and `oracle_shuffled` estimators) and ["shuffle_priorities"] (`oracle_shuffled`)
with `jaxcredit.credit.extras`; the training loop finds them through the
"jaxcredit.extras" entry point, so `train` never imports the lab. The oracle's
teacher-forced passes are not charged to the run's generated tokens: it is an
upper bound on information.
"""

import jax
import numpy as np

from jaxcredit import tasks
from jaxcredit.credit import extras
from jaxcredit.lab import oracle, sum_tree, turn_oracle


def exact_credit(model, task: tasks.TrainTask, rollout, examples) -> tuple[dict, dict]:
  """({"oracle_advantages", "oracle_values"}, metrics) of the exact oracle for `task`:
  filler-blind key_token (token credit, E-DEC), target_sum (token credit, E-TREE), or
  key_turns (turn credit A_k = V(h_(k+1)) - V(h_k) on each turn's action, V(h_k) there as
  the value)."""
  if task.name == "key_turns":
    values, credit = turn_oracle.turn_credit(model, task.config, rollout.tokens,
                                             rollout.token_valid)
    before = np.zeros(credit.shape, np.float32)  # V(h_k) on turn k's action (one per turn)
    mask = np.asarray(rollout.mask, bool)
    for row in range(len(mask)):
      before[row, np.flatnonzero(mask[row])] = values[row, :mask[row].sum()]
    return ({"oracle_advantages": credit.astype(np.float32), "oracle_values": before},
            {"oracle_passes": 1})
  reason = no_exact_oracle(task)
  if reason:
    raise ValueError(reason)
  tokens, mask = np.asarray(rollout.tokens), np.asarray(rollout.mask)
  if task.name == "target_sum":
    targets = np.asarray([int(e["target"]) for e in examples])
    credit = sum_tree.tree_credit(model, task.config, tokens, mask, targets)
  else:
    targets = np.stack([np.asarray(e["targets"]) for e in examples])
    credit = oracle.decisive_credit(model, task.config, tokens, mask, targets)
  return ({"oracle_advantages": credit.advantages, "oracle_values": credit.values},
          {"oracle_passes": credit.cost["passes"]})


def no_exact_oracle(task: tasks.TrainTask) -> str | None:
  """Why `task` has no exact oracle (None when it has one): only key_token (filler-blind
  and constrained), target_sum and key_turns do."""
  if task.name in ("target_sum", "key_turns"):
    return None
  if task.name != "key_token":
    return (f"an exact oracle exists for key_token, target_sum and key_turns only, not "
            f"{task.name!r}; use vineppo (Monte Carlo).")
  reason = oracle.not_exact(task.config)
  return (f"{reason}: set task.options filler_blind=True and constrained=True, or use vineppo "
          "(Monte Carlo).") if reason else None


def _exact_oracle(context: extras.Context, rollout) -> tuple[dict, dict]:
  return exact_credit(context.model, context.task, rollout, context.examples)


def _at_temperature_one(temperature: float) -> extras.Hook:
  if temperature != 1.0:
    raise ValueError(
        f"The exact oracle is computed at temperature 1, not rl.temperature = {temperature}.")
  return _exact_oracle


extras.register("oracle_advantages", "oracle_values", refuses=no_exact_oracle)(
    lambda settings, *, temperature: _at_temperature_one(temperature))


@extras.register("shuffle_priorities")
def _shuffle(settings, *, temperature: float) -> extras.Hook:
  """[B, T] uniform draws in [0, 1) that permute the oracle's credit (`oracle_shuffled`)."""
  del settings, temperature
  return lambda context, rollout: (
      {"shuffle_priorities": jax.random.uniform(context.key, rollout.mask.shape)}, {})
