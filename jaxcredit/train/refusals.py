"""Refusals before any work: settings no run can use, batches that do not
split, a resume with other settings, and rewards that are not finite."""

import importlib.util
import math
from collections.abc import Callable, Collection, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxcredit.credit import extras as extras_lib
from jaxcredit.models import sharding
from jaxcredit.rollout import MissingFields, PolicyOutputs, Rollout
from jaxcredit.train import base_config, overlap, staleness

# Settings a resumed run must share with the run that wrote its checkpoints.
RESUME_FIELDS = ("seed", "task", "model", "critic.preset", "rl.group_size", "rl.prompts_per_step",
                 "rl.max_staleness", "rl.staleness_mode", "rl.sync_every", "mesh.sampler_shape",
                 "advantage", "objective")
# What a config.json written before a field existed meant by its absence.
RESUME_DEFAULTS = {"rl.max_staleness": 0, "rl.staleness_mode": "fixed", "rl.sync_every": 1,
                   "mesh.sampler_shape": None, "task.max_reward_failures": 1.0,
                   "model.random_init": False}


def check_resumable(saved: dict, config: dict) -> None:
  """Refuses to resume with settings a checkpoint cannot continue.

  Args:
    saved: the workdir's saved config.json.
    config: this run's config as a dict.

  Raises:
    ValueError: naming every `RESUME_FIELDS` entry where they differ.
  """
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


# Base fields a task may drop: the data it builds (a task reading files has no sizes or options).
TASK_DATA_FIELDS = ("task.options", "task.train_size", "task.test_size")
# Fields whose contents are free-form (a spec or a task's own options), not config fields.
OPEN_FIELDS = ("advantage", "objective", "task.options", "model.overrides")


def _field_names(config, prefix: str = "") -> set[str]:
  """The dotted names of a ConfigDict's fields, down to its leaves (`OPEN_FIELDS` are leaves)."""
  names = set()
  for key, value in config.items():
    names.add(prefix + key)
    if isinstance(value, ml_collections.ConfigDict) and prefix + key not in OPEN_FIELDS:
      names |= _field_names(value, f"{prefix}{key}.")
  return names


def check_complete(config) -> None:
  """Refuses a config that lacks fields of `base_config` (the loop reads every one of them),
  except a task's data fields (`TASK_DATA_FIELDS`).

  Args:
    config: the run's config (`base_config.get_config()` with overrides).

  Raises:
    ValueError: naming the missing fields.
  """
  missing = sorted(_field_names(base_config.get_config()) - _field_names(config)
                   - set(TASK_DATA_FIELDS))
  if missing:
    raise ValueError(f"The config lacks {', '.join(missing)}: build it on "
                     "jaxcredit.train.base_config.get_config(), which holds every field and its "
                     "default, and override what differs.")


def validate_config(config) -> None:
  """Refuses a config that lacks a field (`check_complete`) or holds hyperparameters no run
  can use.

  Args:
    config: the run's config (`base_config.get_config()` with overrides).

  Raises:
    ValueError: naming the field.
  """
  check_complete(config)
  rl, sft = config.rl, config.sft
  problems = [
      _positive_int(rl.group_size, "rl.group_size"),
      _positive_int(rl.prompts_per_step, "rl.prompts_per_step"),
      _positive_int(rl.epochs, "rl.epochs"),
      _positive_int(rl.minibatches, "rl.minibatches"),
      _positive_int(rl.eval_every, "rl.eval_every"),
      _positive_int(rl.logits_per_chunk, "rl.logits_per_chunk"),
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
      _number_in(config.task.max_dropped_fraction, "task.max_dropped_fraction",
                 0.0, 1.0),
      _number_in(config.task.max_reward_failures, "task.max_reward_failures",
                 0.0, 1.0, low_open=True),
  ]
  task = config.task
  problems += [_positive_int(task[field], f"task.{field}")
               for field in ("train_size", "test_size", "max_prompt_length", "max_response_length")
               if field in task]
  if task.eval_size is not None:
    problems.append(_positive_int(task.eval_size, "task.eval_size (None: every test problem)"))
  if rl.eval_batch_size is not None:
    problems.append(_positive_int(rl.eval_batch_size, "rl.eval_batch_size (None: one batch)"))
  if config.export.every:
    problems += [_positive_int(config.export.every, "export.every"),
                 _positive_int(config.export.groups, "export.groups")]
  staleness.check_settings(rl.max_staleness, rl.staleness_mode)
  truncated_reward = config.task.truncated_reward
  problems.append((isinstance(truncated_reward, (int, float)) and math.isfinite(truncated_reward),
                   f"task.truncated_reward must be a finite number, got {truncated_reward!r}"))
  if config.mesh.shape is not None:
    sharding.check_mesh_shape(config.mesh.shape)
  overlap.check_settings(rl.sync_every)
  if config.mesh.sampler_shape is not None:
    sharding.check_mesh_shape(config.mesh.sampler_shape, field="mesh.sampler_shape")
    problems.append((rl.max_staleness == 0,
                     "rl.max_staleness must be 0 with mesh.sampler_shape (the sampler's own "
                     f"devices set the staleness through rl.sync_every), got {rl.max_staleness!r}"))
  if config.wandb.project:
    problems += [
        (importlib.util.find_spec("wandb") is not None,
         f"wandb.project is {config.wandb.project!r}, but wandb is not installed: pip install "
         "'jaxcredit[wandb]' (or set --config.wandb.project='')"),
        (config.wandb.mode in ("online", "offline"),
         f"wandb.mode must be 'online' or 'offline', got {config.wandb.mode!r}")]
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
  """Refuses a batch that cannot be split evenly into minibatches of whole groups and over the
  devices.

  Args:
    config: the run's config (`base_config.get_config()` with overrides).
    devices: the devices the batch is sharded over.

  Raises:
    ValueError: naming the numbers.
  """
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
  """Refuses non-finite rewards (a normalising estimator would otherwise turn the whole batch's
  advantages into 0 or NaN).

  Args:
    rewards: ``[B]`` the batch's rewards.
    task: the task's name.
    rl_step: the step.

  Raises:
    ValueError: naming the task, the step and the rows.
  """
  bad = np.flatnonzero(~np.isfinite(rewards))
  if bad.size:
    raise ValueError(
        f"Task {task!r} gave non-finite rewards at RL step {rl_step}: row {int(bad[0])} = "
        f"{rewards[bad[0]]} ({bad.size} of {rewards.size} rows); rewards must be finite numbers.")


# The setting that gives the learner each Rollout field a run may lack.
FIELD_SETTINGS = {
    "values": "set critic.preset (a value model supplies V(s_t): --config.critic.preset=tiny)",
    "old_logprobs": "set --config.rl.recompute_old_logprobs=True (one more forward pass a step)",
    "staleness": "set rl.max_staleness > 0 or mesh.sampler_shape (stale or overlapped sampling)",
    "token_rewards": "set rl.kl_reward_coef > 0 (a per-token KL penalty)",
    "turn_ids": "use a multi-turn task (key_turns or calculator)",
}
# What a multi-turn rollout adds to rollout.extras (`rollout_sources.MultiTurn`): name ->
# (per token, dtype).
EPISODE_EXTRAS = {"turn_rewards": (True, jnp.float32), "turn_anchors": (True, jnp.int32),
                  "turns": (False, jnp.int32), "cut_turns": (False, jnp.int32),
                  "dropped_tokens": (False, jnp.int32), "env_seeds": (False, jnp.uint32)}


def run_fields(config, *, multi_turn: bool, sampler: bool) -> set[str]:
  """The optional Rollout fields the learner of a config sees: the sampler's, the reference
  log-probs, and those that settings switch on (`FIELD_SETTINGS`).

  Args:
    config: the run's config (`base_config.get_config()` with overrides).
    multi_turn: the task is multi-turn (turn ids).
    sampler: a separate sampler supplies the batches (staleness).

  Returns:
    the field names.
  """
  rl = config.rl
  switched = {"values": bool(config.critic.preset),
              "old_logprobs": bool(rl.recompute_old_logprobs),
              "staleness": bool(rl.max_staleness) or sampler,
              "token_rewards": bool(rl.kl_reward_coef), "turn_ids": multi_turn}
  return {"behaviour_logprobs", "entropy", "truncated", "positions", "token_valid",
          "ref_logprobs", *(field for field, on in switched.items() if on)}


def check_learner_inputs(advantage: Callable, objective: Callable | None, *, rows: int,
                         columns: int, group_size: int, fields: Collection[str],
                         extras: Sequence[str] = (), multi_turn: bool = False,
                         tree_depth: int | None = None) -> None:
  """Refuses, before any work, an advantage or objective that needs a Rollout field the run
  never provides.

  Both are traced (`jax.eval_shape`: shapes only, nothing computed) on a
  ``[rows, columns]`` rollout holding exactly `fields` (see `run_fields`), the `extras` keys
  the extras providers add (float32, ``[B, T]``, ``[B]`` or ``[B, K]`` as their providers declare:
  `extras.layout`) and, for `multi_turn`, the episode extras.

  Args:
    advantage: ``advantage(rollout) -> Estimate``.
    objective: the objective, or None to check the advantage alone.
    rows: B.
    columns: L.
    group_size: G.
    fields: the optional Rollout fields the run provides.
    extras: the rollout.extras keys the providers add.
    multi_turn: add the multi-turn episode extras.
    tree_depth: D of a tree rollout (`rollout.tree`): add its tree_path ``[B, D + 1]`` and
      tree_segments; None for independent responses.

  Raises:
    ValueError: naming each missing field and the setting that provides it.
  """
  token = lambda dtype: jax.ShapeDtypeStruct((rows, columns), dtype)
  row = lambda dtype: jax.ShapeDtypeStruct((rows,), dtype)
  optional = {"behaviour_logprobs": token(jnp.float32), "entropy": token(jnp.float32),
              "truncated": row(jnp.bool_), "positions": token(jnp.int32),
              "token_valid": token(jnp.bool_), "ref_logprobs": token(jnp.float32),
              "old_logprobs": token(jnp.float32), "values": token(jnp.float32),
              "token_rewards": token(jnp.float32), "staleness": row(jnp.int32),
              "turn_ids": token(jnp.int32)}
  layouts = {"token": token, "sequence": row,
             "vector": lambda dtype: jax.ShapeDtypeStruct((rows, 1), dtype)}
  probe_extras = {key: layouts[extras_lib.layout(key)](jnp.float32) for key in extras}
  if multi_turn:
    probe_extras.update({key: (token if per_token else row)(dtype)
                         for key, (per_token, dtype) in EPISODE_EXTRAS.items()})
  if tree_depth is not None:
    probe_extras.update(tree_path=jax.ShapeDtypeStruct((rows, tree_depth + 1), jnp.int32),
                        tree_segments=token(jnp.int32))
  probe = Rollout(tokens=token(jnp.int32), mask=token(jnp.bool_), rewards=row(jnp.float32),
                  **{field: optional[field] for field in fields}, extras=probe_extras,
                  group_size=group_size)
  outputs = PolicyOutputs(logprobs=token(jnp.float32), entropy=token(jnp.float32),
                          values=token(jnp.float32) if "values" in fields else None)
  try:
    jax.eval_shape(lambda r, o, step: advantage(r) if objective is None
                   else objective(o, r, advantage(r), step),
                   probe, outputs, jax.ShapeDtypeStruct((), jnp.int32))
  except MissingFields as error:
    fixes = "; ".join(f"rollout.{field}: {FIELD_SETTINGS.get(field, 'no setting provides it')}"
                      for field in error.fields)
    raise ValueError(f"{error} This run never provides it: {fixes}.") from None


def check_mesh_for_actions(mesh_shape: dict, task_name: str, typed_actions: bool) -> None:
  """Refuses a mesh XLA cannot partition the learner on when the task restricts the tokens
  allowed per position (`Actions.allowed`): its SPMD partitioner aborts the process (a C++
  check, no Python error) on that table's gather in the sequence-parallel head when the
  sequence and model axes and the data or fsdp axis are all over 1.

  Args:
    mesh_shape: ``{axis: size}``.
    task_name: the task's name, for the message.
    typed_actions: the task restricts the allowed tokens per position.

  Raises:
    ValueError: naming the axes.
  """
  sizes = {axis: mesh_shape.get(axis, 1) for axis in ("data", "fsdp", "sequence", "model")}
  if not (typed_actions and sizes["sequence"] > 1 and sizes["model"] > 1
          and sizes["data"] * sizes["fsdp"] > 1):
    return
  shape = tuple(sizes.values())
  raise ValueError(
      f"Task {task_name!r} restricts the tokens allowed per position, and XLA cannot partition "
      f"that head over mesh.shape (data, fsdp, sequence, model) = {shape}, where the sequence "
      "and model axes and the data or fsdp axis are all over 1; use sequence = 1, model = 1, or "
      "data = fsdp = 1 (e.g. (1, 1, 4, 2) or (2, 2, 2, 1) on 8 devices).")
