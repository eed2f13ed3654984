"""Refusals before any work: settings no run can use, batches that do not
split, a resume with other settings, and rewards that are not finite."""

import math

import numpy as np

from jaxcredit.models import sharding
from jaxcredit.train import overlap, staleness


# Settings a resumed run must share with the run that wrote its checkpoints.
RESUME_FIELDS = ("seed", "task", "model", "critic.preset", "rl.group_size", "rl.prompts_per_step",
                 "rl.max_staleness", "rl.staleness_mode", "rl.sync_every", "mesh.sampler_shape",
                 "advantage", "objective")
# What a config.json written before a field existed meant by its absence.
RESUME_DEFAULTS = {"rl.max_staleness": 0, "rl.staleness_mode": "fixed", "rl.sync_every": 1,
                   "mesh.sampler_shape": None}


def check_resumable(saved: dict, config: dict) -> None:
  """Raises ValueError naming every RESUME_FIELDS entry where `config` differs
  from the workdir's saved config.json (`saved`)."""
  def leaves(tree, prefix=""):
    """{dotted.key: value} of a nested dict."""
    if not isinstance(tree, dict) or not tree:
      return {prefix: tree}
    return {
        k: v for key, value in tree.items()
        for k, v in leaves(value, f"{prefix}.{key}".lstrip(".")).items()
    }

  saved, config = ({**RESUME_DEFAULTS, **leaves(tree)} for tree in (saved, config))
  checked = [k for k in sorted(set(saved) | set(config))
             if any(k == field or k.startswith(field + ".") for field in RESUME_FIELDS)]
  differing = [
      f"{k}: {saved.get(k)!r} -> {config.get(k)!r}" for k in checked
      if saved.get(k) != config.get(k)
  ]
  if differing:
    raise ValueError(
        "This workdir holds checkpoints of a run with other settings; resume it with the same "
        "ones or use a new workdir. Differing: " + "; ".join(differing) + ".")


def _positive_int(value, name):
  return isinstance(value, int) and value >= 1, f"{name} must be a positive int, got {value!r}"


def _number_in(value, name, low, high=float("inf"), *, low_open=False):
  above = value > low if low_open else value >= low
  ok = isinstance(value, (int, float)) and above and value <= high
  bounds = f"{'(' if low_open else '['}{low}, {high}]"
  return ok, f"{name} must be a number in {bounds}, got {value!r}"


def validate_config(config) -> None:
  """Raises ValueError naming the field for hyperparameters no run can use."""
  rl, sft = config.rl, config.sft
  problems = [
      _positive_int(rl.group_size, "rl.group_size"),
      _positive_int(rl.prompts_per_step, "rl.prompts_per_step"),
      _positive_int(rl.epochs, "rl.epochs"),
      _positive_int(rl.minibatches, "rl.minibatches"),
      _positive_int(rl.eval_every, "rl.eval_every"),
      _positive_int(sft.batch_size, "sft.batch_size"),
      _positive_int(sft.eval_every, "sft.eval_every"),
      _positive_int(config.checkpoint.every, "checkpoint.every"),
      _positive_int(config.checkpoint.keep, "checkpoint.keep"),
      (isinstance(rl.steps, int) and rl.steps >= 0,
       f"rl.steps must be an int >= 0, got {rl.steps!r}"),
      (isinstance(sft.max_steps, int) and sft.max_steps >= 0,
       f"sft.max_steps must be an int >= 0, got {sft.max_steps!r}"),
      _number_in(rl.learning_rate, "rl.learning_rate", 0.0, low_open=True),
      _number_in(sft.learning_rate, "sft.learning_rate", 0.0, low_open=True),
      _number_in(rl.max_grad_norm, "rl.max_grad_norm", 0.0, low_open=True),
      _number_in(rl.temperature, "rl.temperature", 0.0, low_open=True),
      _number_in(rl.kl_reward_coef, "rl.kl_reward_coef", 0.0),
      _number_in(sft.target_accuracy, "sft.target_accuracy", 0.0, 1.0),
      _number_in(sft.noise, "sft.noise", 0.0, 1.0),
      _number_in(config.task.get("max_dropped_fraction", 0.1), "task.max_dropped_fraction",
                 0.0, 1.0),
  ]
  export = config.get("export") or {}
  if export.get("every", 0):
    problems += [_positive_int(export.every, "export.every"),
                 _positive_int(export.get("groups", 2), "export.groups")]
  staleness.check_settings(rl.get("max_staleness", 0), rl.get("staleness_mode", "fixed"))
  truncated_reward = config.task.get("truncated_reward", 0.0)
  problems.append((isinstance(truncated_reward, (int, float)) and math.isfinite(truncated_reward),
                   f"task.truncated_reward must be a finite number, got {truncated_reward!r}"))
  if config.mesh.shape is not None:
    sharding.check_mesh_shape(config.mesh.shape)
  overlap.check_settings(rl.get("sync_every", 1))
  if config.mesh.get("sampler_shape") is not None:
    sharding.check_mesh_shape(config.mesh.sampler_shape, field="mesh.sampler_shape")
    problems.append((rl.get("max_staleness", 0) == 0,
                     "rl.max_staleness must be 0 with mesh.sampler_shape (the sampler's own "
                     f"devices set the staleness through rl.sync_every), got {rl.max_staleness!r}"))
  if config.critic.preset:
    problems += [
        _number_in(config.critic.learning_rate, "critic.learning_rate", 0.0, low_open=True),
        _number_in(config.critic.gamma, "critic.gamma", 0.0, 1.0),
        _number_in(config.critic.lam, "critic.lam", 0.0, 1.0)
    ]
  for ok, message in problems:  # NaN fails every comparison, so it is caught too
    if not ok:
      raise ValueError(message + ".")


def check_batch_sizes(config, devices: int) -> None:
  """Raises ValueError naming the numbers when a batch cannot be split evenly."""
  rl = config.rl
  rows = rl.prompts_per_step * rl.group_size
  minibatch = rows // max(rl.minibatches, 1)
  problems = [
      (rl.minibatches >= 1 and rows % rl.minibatches == 0,
       f"rl.prompts_per_step * rl.group_size = {rows} is not divisible by rl.minibatches = "
       f"{rl.minibatches}"),
      (minibatch % rl.group_size == 0,
       f"a minibatch of {minibatch} rows does not hold whole groups of rl.group_size = "
       f"{rl.group_size}"),
      (minibatch % devices == 0,
       f"a minibatch of {minibatch} rows is not divisible by the {devices} batch-sharded devices"),
      (config.sft.batch_size % devices == 0,
       f"sft.batch_size = {config.sft.batch_size} is not divisible by the {devices} "
       "batch-sharded devices"),
  ]
  for ok, message in problems:
    if not ok:
      raise ValueError(message + ".")


def check_rewards(rewards: np.ndarray, *, task: str, rl_step: int) -> None:
  """Raises ValueError naming the task, the step and the rows when a reward is NaN or infinite
  (a normalising estimator would otherwise turn the whole batch's advantages into 0 or NaN)."""
  bad = np.flatnonzero(~np.isfinite(rewards))
  if bad.size:
    raise ValueError(
        f"Task {task!r} gave non-finite rewards at RL step {rl_step}: row {int(bad[0])} = "
        f"{rewards[bad[0]]} ({bad.size} of {rewards.size} rows); rewards must be finite numbers.")
