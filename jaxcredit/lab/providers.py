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

from jaxcredit import tasks
from jaxcredit.credit import extras


def exact_credit(model, task: tasks.TrainTask, rollout, examples) -> tuple[dict, dict]:
  """The exact credit of a rollout from the oracle the task registers (`tasks.Task.oracle`):
  e.g. key_token's E-DEC, target_sum's E-TREE, key_turns' turn credit.

  Args:
    model: the policy that sampled the rollout.
    task: the run's `TrainTask`.
    rollout: the sampled `Rollout`.
    examples: the task example of each row.

  Returns:
    ``({"oracle_advantages", "oracle_values"}, metrics)``.

  Raises:
    ValueError: naming why where the task, or its options, have no exact oracle.
  """
  reason = no_exact_oracle(task)
  if reason:
    raise ValueError(reason)
  return tasks.get(task.name).oracle.exact_extras(model, task.config, rollout, examples)


def no_exact_oracle(task: tasks.TrainTask) -> str | None:
  """Why a task has no exact oracle.

  Args:
    task: a `TrainTask`.

  Returns:
    the reason, or None when it has one.
  """
  oracle = tasks.get(task.name).oracle
  if oracle is None:
    return (f"an exact oracle exists for {', '.join(tasks.names('oracle'))} only, not "
            f"{task.name!r}; use "
            "vineppo (Monte Carlo).")
  return oracle.no_exact_oracle(task.config)


def _exact_oracle(context: extras.Context, rollout) -> tuple[dict, dict]:
  return exact_credit(context.model, context.task, rollout, context.examples)


def _at_temperature_one(temperature: float) -> extras.Hook:
  if temperature != 1.0:
    raise ValueError(
        f"The exact oracle is computed at temperature 1, not rl.temperature = {temperature}.")
  return _exact_oracle


extras.register("oracle_advantages", "oracle_values", refuses=no_exact_oracle)(
    lambda settings, *, temperature: _at_temperature_one(temperature))


@extras.register_traceable("shuffle_priorities")
def _shuffle(rollout, key, vocab_size) -> dict:
  """[B, T] uniform draws in [0, 1) that permute the oracle's credit (`oracle_shuffled`)."""
  del vocab_size
  return {"shuffle_priorities": jax.random.uniform(key, rollout.mask.shape)}
