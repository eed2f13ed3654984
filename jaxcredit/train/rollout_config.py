"""How a run samples, from `config.rollout`: the continuous engine's slots, partial rollouts
across steps, the tree each prompt's group is sampled as, and the rollout source that plays
them (`SingleTurn`, or `MultiTurn` for a task with an environment). Each setting that does
not suit the task or the others is refused naming it.
"""

import math

import jax
import numpy as np

from jaxcredit import _checks, tasks
from jaxcredit.models import sharding
from jaxcredit.rollout_sources import MultiTurn, PartialRollouts, SingleTurn, TurnTree
from jaxcredit.sampling import TreeSpec

def engine_slots(config, task: tasks.TrainTask) -> int | None:
  """The continuous engine's slot count (`config.rollout.engine`, `config.rollout.slots`), or
  None for the static sampler.

  Args:
    config: the experiment config.
    task: the run's task.

  Returns:
    the responses `SingleTurn` decodes at once, or the episodes `MultiTurn` plays at once;
    None.

  Raises:
    ValueError: naming the setting, for an unknown engine, slots outside [1, the step's
      rows], or the continuous engine with a tree or with a multi-turn task on several
      processes.
  """
  rollout, rows = config.rollout, config.rl.prompts_per_step * config.rl.group_size
  _checks.check_choice(rollout.engine, ("static", "continuous"), "rollout.engine")
  if rollout.engine == "static":
    return None
  if config.rollout.tree.fork != "none":
    raise ValueError("rollout.engine = 'continuous' samples independent responses or episodes: "
                     "set rollout.tree.fork = 'none', or rollout.engine = 'static'.")
  if task.environment is not None and jax.process_count() > 1:
    raise ValueError("rollout.engine = 'continuous' plays a multi-turn task's episodes on one "
                     "process: set rollout.engine = 'static' to play them over several.")
  slots = max(1, rows // 4) if rollout.slots is None else rollout.slots
  if not 1 <= slots <= rows:
    raise ValueError(f"rollout.slots = {slots} must lie in [1, rl.prompts_per_step x "
                     f"rl.group_size = {rows}].")
  return slots


def partial_rollouts(config, source: SingleTurn | MultiTurn) -> PartialRollouts | None:
  """The partial rollouts of `config.rollout.partial_decode_steps` over `source`, or None.

  Args:
    config: the experiment config.
    source: the run's rollout source.

  Returns:
    a `PartialRollouts`, or None when the setting is unset.

  Raises:
    ValueError: naming the setting, without the continuous engine, with a multi-turn task,
      with stale or overlapped sampling (rl.max_staleness, mesh.sampler_shape), or a limit
      below 1.
  """
  limit = config.rollout.partial_decode_steps
  if limit is None:
    return None
  if config.rollout.engine != "continuous":
    raise ValueError("rollout.partial_decode_steps needs the continuous engine: set "
                     "rollout.engine = 'continuous'.")
  if isinstance(source, MultiTurn):
    raise ValueError("rollout.partial_decode_steps carries single-turn responses across steps; "
                     "a multi-turn task's episodes are played whole within a step: unset it.")
  if config.rl.max_staleness or config.mesh.sampler_shape:
    raise ValueError("rollout.partial_decode_steps records each token's own staleness: it "
                     "does not combine with rl.max_staleness or mesh.sampler_shape.")
  return PartialRollouts(source, limit)


def tree_spec(config, task: tasks.TrainTask) -> TreeSpec | TurnTree | None:
  """The tree of `config.rollout.tree`: a `TreeSpec` of a single-turn task's responses, a
  `TurnTree` of a multi-turn task's episodes (``fork="turns"``), or None for independent
  ones.

  Args:
    config: the experiment config.
    task: the run's task.

  Returns:
    the tree each prompt's group is sampled as, or None.

  Raises:
    ValueError: naming the setting, for a tree that does not fit the response budget or the
      episode's turns, whose leaves are not rl.group_size, or whose fork rule does not suit
      the task.
  """
  settings = config.rollout.tree
  if settings.fork == "none":
    return None
  if (settings.fork == "turns") != (task.environment is not None):
    raise ValueError(
        f"rollout.tree.fork = {settings.fork!r} does not suit task {task.name!r}: a multi-turn "
        "task's episodes fork between turns (fork='turns'), a single-turn task's responses "
        "at columns (fork='fixed', 'delimiter' or 'entropy').")
  if settings.fork == "turns":
    spec = TurnTree(roots=settings.roots, branching=settings.branching, depth=settings.depth,
                    segment_turns=settings.segment_turns).check(task.max_turns)
  else:
    spec = TreeSpec(roots=settings.roots, branching=settings.branching, depth=settings.depth,
                    segment_tokens=settings.segment_tokens, fork=settings.fork,
                    delimiter=settings.delimiter,
                    entropy_threshold=settings.entropy_threshold).check(task.max_response_length,
                                                                        task.actions)
  if spec.leaves != config.rl.group_size:
    raise ValueError(
        f"rollout.tree has {spec.leaves} leaves per prompt (roots {spec.roots} x branching "
        f"{spec.branching}^depth {spec.depth}) and they are the prompt's group, but "
        f"rl.group_size is {config.rl.group_size}: set rl.group_size = {spec.leaves} or "
        "change the tree.")
  return spec


def tree_pass(config, task: tasks.TrainTask) -> dict:
  """The learner's tree settings: a ``fork="fixed"`` tree's prefixes computed once (its columns
  are the sampler's); a delimiter tree's closed-up rows one by one.

  Args:
    config: the experiment config.
    task: the run's task.

  Returns:
    keyword arguments of `learner.Settings`: {"tree", "prompt_length"} for a fixed tree, else
    none.
  """
  tree = tree_spec(config, task)
  if not isinstance(tree, TreeSpec) or tree.fork != "fixed":
    return {}
  return {"tree": tree, "prompt_length": task.max_prompt_length}


def sampling_placement(mesh, place, local):
  """Where the sampled rows go: on one process, over the batch axes and `sequence` wherever
  they divide (`sharding.sampling_sharding`), else where the learner's go.

  Args:
    mesh: the run's mesh.
    place: the learner's placement of a host array.
    local: the learner's way back to this process's rows.

  Returns:
    (place, local) for the rollout source.
  """
  if jax.process_count() > 1:
    return place, local
  rows = sharding.sampling_sharding(mesh)
  shards = math.prod(mesh.shape[a] for a in rows.spec[0] or ())
  return (lambda x: jax.device_put(x, rows) if np.shape(x)[0] % shards == 0 else place(x),
          np.asarray)


def rollout_source(config, task: tasks.TrainTask, place, local) -> SingleTurn | MultiTurn:
  """One sampled response per row (or a tree of them per prompt) scored by the task, or
  multi-turn episodes in the task's environment.

  Args:
    config: the experiment config.
    task: the run's task.
    place: places a host array where the sampler reads it (`sampling_placement`).
    local: this process's rows of a placed array.

  Returns:
    a `SingleTurn`, or a `MultiTurn` for a task with an environment.

  Raises:
    ValueError: naming the setting, as `tree_spec` and `engine_slots` do.
  """
  if task.environment is None:
    return SingleTurn(task.score_rows, task.max_response_length, group_size=config.rl.group_size,
                      temperature=config.rl.temperature, stop_tokens=task.stop_tokens,
                      pad_id=task.pad_id, actions=task.actions, place=place, local=local,
                      tree=tree_spec(config, task), slots=engine_slots(config, task))
  return tasks.multi_turn_source(task, group_size=config.rl.group_size,
                                 temperature=config.rl.temperature, place=place, local=local,
                                 tree=tree_spec(config, task), slots=engine_slots(config, task))
