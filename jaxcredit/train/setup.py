"""A training run's `Trainer`: everything the loop (`jaxcredit.train.loop`) reads, built
once from the config and the workdir (`build`): the checks, the task's data, the policy (a
checkpoint's or a preset's), the reference, critic and optimizers, the learner step, the
extras providers, the mesh and the checkpoint state (restored when resuming).
"""

import dataclasses
import functools
import json
import math
import pathlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx
from jax.experimental import multihost_utils

from jaxcredit import estimators, losses, tasks
from jaxcredit.atomic import write_atomically
from jaxcredit.credit import extras
from jaxcredit.models import Transformer, huggingface, preset, sharding
from jaxcredit.rollout import Rollout
from jaxcredit.rollout_sources import MultiTurn, PartialRollouts, SingleTurn
from jaxcredit.tasks import loader
from jaxcredit.train import (
  checkpoints,
  data,
  export,
  learner,
  metrics,
  multihost,
  overlap,
  refusals,
  rollout_config,
  staleness,
)

# TransformerConfig fields that change a model's parameter shapes (a checkpoint's weights).
SHAPE_FIELDS = frozenset({"vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff",
                          "head_dim", "qkv_bias", "qk_norm", "tie_embeddings"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Trainer:
  """Everything a training run reads, built once by `build`; `counters` is the one part that
  changes (in place) as the run goes.

  Attributes:
    config: the run's config.
    workdir: the run's directory.
    checkpointer: its `Checkpointer`.
    resumed: the run resumed from a checkpoint.
    counters: rl_step, step (SFT + RL) and gen_tokens, checkpointed.
    mesh: the learner's mesh.
    place: host-local rows -> a global batch-sharded array.
    local: a global array -> this process's rows.
    task: the `TrainTask`.
    data_counts: the data check's counts (`data.check_data`).
    prompt_lengths: ``[n]`` token counts of the train split's prompts.
    eval_batch: the evaluation prompts (`data.evaluation_batch`).
    source: prompts -> a scored `Rollout` (single- or multi-turn).
    modules: model, optimizer, reference[, critic, critic_optimizer].
    learner_step: the jitted learner step (`learner.make_step`).
    provide_extras: what the estimators need (`credit.extras.Chain`), or None.
    reference_logprobs: ``(reference, rollout) -> [B, L]`` log-probs.
    stale: the parameters stale rollouts are sampled with (`staleness.StaleParameters`).
    sampler: the sampler's own devices (mesh.sampler_shape), or None.
    rl_data: the RL prompts' `Loader`.
    writer: the `MetricsWriter`.
    exporter: the per-token export (export.every > 0), or None.
  """

  config: object
  workdir: pathlib.Path
  checkpointer: checkpoints.Checkpointer
  resumed: bool
  counters: dict  # rl_step, step (SFT + RL), gen_tokens: checkpointed
  mesh: jax.sharding.Mesh
  place: Callable  # host-local rows -> global batch-sharded array
  local: Callable  # global array -> this process's rows
  task: tasks.TrainTask
  data_counts: dict
  prompt_lengths: np.ndarray  # [n] token counts of the train split's prompts
  eval_batch: dict
  source: SingleTurn | MultiTurn  # prompts -> scored Rollout
  partial: PartialRollouts | None  # rollout.partial_decode_steps: responses across steps
  modules: dict  # model, optimizer, reference[, critic, critic_optimizer]
  learner_step: Callable
  provide_extras: extras.Chain | None  # what the estimators need (None: nothing)
  reference_logprobs: Callable  # (reference, rollout) -> [B, L] log-probs
  stale: staleness.StaleParameters  # the parameters stale rollouts are sampled with
  sampler: overlap.Sampler | None  # the sampler's own devices (mesh.sampler_shape)
  rl_data: loader.Loader
  writer: metrics.MetricsWriter
  exporter: export.Exporter | None  # export.every > 0: per-token Parquet (train.export)

  def sample(self, rl_step: int, key: jax.Array) -> tuple[dict, Rollout]:
    """Update rl_step's prompts and their scored rollout, on the learner's mesh, sampled
    with the parameters after update rl_step - lag (the lag recorded on every row when
    it can be nonzero)."""
    rl = self.config.rl
    batch = self.rl_data.rl_batch(rl_step, group_size=rl.group_size)
    if self.partial is not None:  # a batch ahead in flight: the step's groups, then the next's
      ahead = [self.rl_data.rl_batch(rl_step + 1, group_size=rl.group_size)]
      return self.partial.sample(self.modules["model"],
                                 ahead if self.partial.started else [batch, *ahead],
                                 jax.random.fold_in(key, rl_step))
    if self.sampler is None:
      lag = self.stale.lag(rl_step)
      rollout = self.source(self.stale.sampler(self.modules["model"], lag), batch,
                            jax.random.fold_in(key, rl_step))
    else:  # folded by the sampler: here the fold would queue behind the update in flight
      lag = self.sampler.lag(rl_step)
      rollout = jax.device_put(self.sampler.sample(batch, key, rl_step),
                               sharding.batch_sharding(self.mesh))
    local_rewards = self.local(rollout.rewards)
    refusals.check_rewards(local_rewards, task=self.config.task.name, rl_step=rl_step + 1)
    if self.stale.max_staleness or self.sampler is not None:
      rollout = rollout.replace(staleness=self.place(np.full(local_rewards.shape, lag, np.int32)))
    return batch, rollout

  def checkpointed(self) -> dict:
    """The modules a checkpoint holds (`_checkpointed`)."""
    return _checkpointed(self.modules, self.stale, self.sampler, self.provide_extras)

  def save(self, rl_step: int) -> None:
    """Checkpoints the modules and counters as of RL step `rl_step` (asynchronously)."""
    self.checkpointer.save(rl_step, self.checkpointed(), dict(self.counters), self.mesh)

  def evaluate(self) -> float:
    """Greedy accuracy (fraction of held-out prompts with reward 1)."""
    # One response per prompt; every process evaluates every prompt, placed as sampled rows
    # on one process.
    place = self.source.place if jax.process_count() == 1 else jnp.asarray
    greedy = dataclasses.replace(self.source, temperature=0.0, group_size=1, place=place,
                                 local=np.asarray, tree=None)
    rewards = []
    for chunk, rows in data.batch_chunks(self.eval_batch, self.config.rl.eval_batch_size):
      rollout = greedy(self.modules["model"], chunk, jax.random.key(0))
      rewards.append(np.asarray(rollout.rewards)[:rows])
    failed, scored, reason = self.task.reward_failures.take()  # kept apart from training's
    if failed:
      tqdm.tqdm.write(f"Greedy eval: the reward function raised on {failed} of {scored} "
                      f"responses, scored 0 (first: {reason}).")
    return float(np.mean(np.concatenate(rewards) >= 1.0))

  def train_loader(self, batch_size: int) -> loader.Loader:
    return _train_loader(self.task, self.config.seed, self.prompt_lengths, batch_size)


def _checkpointed(modules: dict, stale: staleness.StaleParameters,
                  sampler: overlap.Sampler | None, provide_extras: extras.Chain | None) -> dict:
  """The modules a checkpoint holds: the learner's, the stale snapshots, the sampler's
  parameters (those the next batch is sampled with) and the extras providers' state
  (PRIME's implicit PRM)."""
  sampler = {} if sampler is None else {"sampler": sampler.model}
  providers = {} if provide_extras is None else provide_extras.modules()
  return {**modules, **stale.snapshots, **sampler, **providers}


def _train_loader(task: tasks.TrainTask, seed: int, prompt_lengths: np.ndarray,
                  batch_size: int) -> loader.Loader:
  return loader.Loader(task.sources["train"], encode=task.encode, batch_size=batch_size,
                       max_prompt_length=task.max_prompt_length, seed=seed, pad_id=task.pad_id,
                       prompt_lengths=prompt_lengths)


def build(config, workdir: pathlib.Path) -> Trainer | None:
  """Everything a run needs before its first step: checks, data, models, the learner step and
  the checkpoint state (restored when resuming).

  Args:
    config: the run's config (`base_config.get_config()` with overrides).
    workdir: the run's directory.

  Returns:
    the `Trainer`, or None (saying so) when the workdir is already at rl.steps.

  Raises:
    ValueError: for settings the run or its checkpoint cannot use.
  """
  checkpointer = checkpoints.Checkpointer(workdir / "checkpoints", keep=config.checkpoint.keep)
  resumed = checkpointer.latest_step() is not None
  config_json = config.to_json_best_effort(indent=2)
  if resumed and (workdir / "config.json").exists():
    refusals.check_resumable(json.loads((workdir / "config.json").read_text()),
                           json.loads(config_json))
    if checkpointer.latest_step() >= config.rl.steps:
      print(f"{workdir} is already at RL step {checkpointer.latest_step()} >= rl.steps = "
            f"{config.rl.steps}: nothing to do (config.json left as it was).")
      return None
  sampler_shape = config.mesh.sampler_shape
  mesh, sampler_mesh = (sharding.split_meshes(config.mesh.shape, sampler_shape) if sampler_shape
                        else (sharding.make_mesh(config.mesh.shape), None))
  batch_spec = sharding.batch_sharding(mesh).spec
  for batch_mesh in filter(None, (mesh, sampler_mesh)):
    refusals.check_batch_sizes(config, math.prod(
        batch_mesh.shape[a] for a in sharding.batch_sharding(batch_mesh).spec[0] or ()))
  # Every process holds its own rows of a global batch (the loader's slice): these
  # assemble them into one global array and take a process's rows back for scoring.
  place = lambda x: multihost_utils.host_local_array_to_global_array(x, mesh, batch_spec)
  local = lambda x: np.asarray(
      multihost_utils.global_array_to_host_local_array(x, mesh, batch_spec))

  # Data: a procedural TFDS dataset, read by step so that batches are reproducible.
  # Process 0 prepares it; the others read it once it is there.
  task = multihost.process_0_first(lambda: tasks.make(
      config.task, data_dir=config.task.data_dir or str(workdir / "data"),
      seed=config.seed, tokenizer=tokenizer_directory(config)))
  if jax.process_index() == 0:  # after every process has checked the previous one
    write_atomically(workdir / "config.json", lambda tmp: tmp.write_text(config_json))
  refusals.check_mesh_for_actions(dict(mesh.shape), task.name, task.actions.per_column)
  lengths = {split: data.split_lengths(task, split) for split in task.sources}  # read once
  data_counts = data.check_data(task, lengths=lengths,
                                 max_dropped_fraction=config.task.max_dropped_fraction)
  # Each test problem that fits, once.
  eval_batch = data.evaluation_batch(task, lengths["test"][:, 0],
                                      limit=config.task.eval_size)
  data_counts["data/test/evaluated"] = len(eval_batch["examples"])
  print(f"Greedy eval on {len(eval_batch['examples'])} held-out problems.")
  # Built and checked before any work, so that an unknown estimator, loss or extra, or one
  # needing what this run never provides, fails at once.
  advantage = estimators.from_config(config.advantage.to_dict())
  objective = losses.from_config(config.objective.to_dict())
  provide_extras = extras.hook(advantage, temperature=config.rl.temperature, task=task)
  _check_learner_inputs(config, task, advantage, objective, sampler=sampler_mesh is not None)

  model = policy(config.model, task, seed=config.seed)
  task = tasks.within_tokenizer(task, model.config.vocab_size)
  placement = rollout_config.sampling_placement(mesh, place, local)
  source = rollout_config.rollout_source(config, task, *placement)
  modules, learner_settings = _learner_modules(config, task, mesh, model)
  graphdef, state = nnx.split(modules)
  learner_step = learner.make_step(graphdef, advantage=advantage, objective=objective,
                                   settings=learner_settings,
                                   state_sharding=jax.tree.map(lambda x: x.sharding, state))
  reference_logprobs = nnx.jit(functools.partial(learner.reference_logprobs,
                                                 settings=learner_settings))
  stale = staleness.StaleParameters(modules["model"], config.rl.max_staleness,
                                    config.rl.staleness_mode, config.seed)
  sampler = None if sampler_mesh is None else overlap.Sampler(
      modules["model"], sampler_mesh, source, config.rl.sync_every)
  prompt_lengths = lengths["train"][:, 0]
  rl_data = _train_loader(task, config.seed, prompt_lengths, config.rl.prompts_per_step)
  counters = {"rl_step": 0, "step": 0, "gen_tokens": 0}
  if provide_extras is not None:  # their state exists before a restore fills it
    provide_extras.start(modules["model"])
  if resumed:
    counters = checkpointer.restore(_checkpointed(modules, stale, sampler, provide_extras), mesh)
    if sampler is not None:  # restored onto the learner's mesh: back to the sampler's devices
      sharding.shard_model(sampler.model, sampler.mesh)
    print(f"Resuming RL at step {counters['rl_step']} from {workdir / 'checkpoints'}.")
  primary = jax.process_index() == 0
  writer = metrics.MetricsWriter(
      workdir, resume_step=counters["step"] if resumed else None, primary=primary,
      wandb_run=metrics.wandb_run(config.wandb, workdir, config.to_dict()) if primary else None)
  settings = config.export
  exporter = export.Exporter(
      workdir, every=settings.every, groups=settings.groups,
      compare=tuple(settings.compare or ()), graphdef=graphdef, advantage=advantage,
      advantage_config=config.advantage.to_dict(), settings=learner_settings, task=task,
      mesh=mesh, temperature=config.rl.temperature,
      tensorboard=writer.tensorboard) if settings.every else None
  return Trainer(
      config=config, workdir=workdir, checkpointer=checkpointer, resumed=resumed,
      counters=counters, mesh=mesh, place=place, local=local, task=task,
      data_counts=data_counts, prompt_lengths=prompt_lengths, eval_batch=eval_batch,
      source=source, partial=rollout_config.partial_rollouts(config, source), modules=modules,
      learner_step=learner_step,
      provide_extras=provide_extras, reference_logprobs=reference_logprobs, stale=stale,
      sampler=sampler, rl_data=rl_data, writer=writer, exporter=exporter)


def _check_learner_inputs(config, task: tasks.TrainTask, advantage, objective, *,
                          sampler: bool) -> None:
  """Refuses (`refusals.check_learner_inputs`) an advantage, objective or exported comparison
  that needs what this run never provides, before any work."""
  rl, multi_turn = config.rl, task.environment is not None
  tree = rollout_config.tree_spec(config, task)
  shape = dict(rows=rl.prompts_per_step * rl.group_size,
               columns=task.max_prompt_length + task.max_response_length,
               group_size=rl.group_size,
               fields=refusals.run_fields(config, multi_turn=multi_turn, sampler=sampler),
               multi_turn=multi_turn, tree_depth=None if tree is None else tree.depth)
  needs = lambda fn: [key for c in estimators.components(fn) for key in c.needs]
  refusals.check_learner_inputs(advantage, objective, extras=needs(advantage), **shape)
  for compare in (config.export.compare or ()) if config.export.every else ():
    try:
      fn = estimators.from_config(compare)
      extras.hook(fn, temperature=rl.temperature, task=task)
      refusals.check_learner_inputs(fn, None, extras=needs(fn), **shape)
    except ValueError as error:
      raise ValueError(f"export.compare entry {compare!r}: {error}") from None


def _learner_modules(config, task: tasks.TrainTask, mesh,
                     model: Transformer) -> tuple[dict, learner.Settings]:
  """The policy, its optimizer, the frozen reference (and a critic with its
  optimizer), placed on `mesh`; and the learner's settings."""
  sharding.shard_model(model, mesh)  # parameters placed by their logical axes
  rl = config.rl
  adam = lambda lr: optax.chain(optax.clip_by_global_norm(rl.max_grad_norm), optax.adam(lr))
  modules = {"model": model,
             "optimizer": nnx.Optimizer(model, adam(rl.learning_rate), wrt=nnx.Param),
             "reference": nnx.clone(model)}  # frozen copy of the policy at the start of RL (KL)
  critic_settings = None
  if config.critic.preset:
    critic = Transformer(
        preset(config.critic.preset, vocab_size=task.vocab_size, value_head=True,
               **config.model.overrides), rngs=nnx.Rngs(config.seed + 1))
    sharding.shard_model(critic, mesh)
    modules.update(
        critic=critic, critic_optimizer=nnx.Optimizer(critic, adam(config.critic.learning_rate),
                                                      wrt=nnx.Param))
    critic_settings = learner.CriticSettings(clip=config.critic.value_clip,
                                             gamma=config.critic.gamma, lam=config.critic.lam)
  settings = learner.Settings(temperature=rl.temperature, actions=task.actions, epochs=rl.epochs,
                              minibatches=rl.minibatches, kl_reward_coef=rl.kl_reward_coef,
                              kl_reward_kind=rl.kl_reward_kind, critic=critic_settings,
                              recompute_old_logprobs=rl.recompute_old_logprobs,
                              logits_per_chunk=rl.logits_per_chunk,
                              **rollout_config.tree_pass(config, task))
  return sharding.place_state(modules, mesh), settings


def tokenizer_directory(config) -> str | None:
  """Where a pretrained task's tokenizer lives.

  Args:
    config: the run's config (`base_config.get_config()` with overrides).

  Returns:
    task.tokenizer, else model.checkpoint (None when neither is set).
  """
  return config.task.tokenizer or config.model.checkpoint


def policy(model_config, task: tasks.TrainTask, *, seed: int) -> Transformer:
  """The policy: a checkpoint's weights (model.checkpoint), its architecture with random
  weights (model.checkpoint + model.random_init), or a preset (vocabulary sized to the
  task's tokenizer unless it is a pretrained one). model.overrides replace config fields;
  model.dtype (the compute dtype), model.attention, model.remat and model.scan_layers set
  theirs.

  Args:
    model_config: ``config.model``.
    task: the `TrainTask`.
    seed: the initialisation seed.

  Returns:
    the `Transformer`.
  """
  overrides = dict(model_config.overrides or {})
  overrides.update({field: model_config[field] for field in ("attention", "remat")
                    if model_config[field]})
  if model_config.scan_layers is not None:
    overrides["scan_layers"] = bool(model_config.scan_layers)
  if model_config.dtype:
    overrides["dtype"] = jnp.dtype(model_config.dtype)
  path = model_config.checkpoint
  if path and not model_config.random_init:
    reshaping = sorted(set(model_config.overrides or {}) & SHAPE_FIELDS)
    if reshaping:
      raise ValueError(
          f"model.overrides sets {', '.join(reshaping)}, which change the shape of the "
          f"checkpoint's model (model.checkpoint = {path}), so its weights would not fit: set "
          "--config.model.random_init=True (that shape, random weights) or "
          "--config.model.overrides={} (the checkpoint as it is).")
    model = huggingface.load_hf_checkpoint(path, **overrides)
  else:
    if path:
      architecture = huggingface.read_config(path, **overrides)
    else:
      vocab = {} if task.pretrained_vocab else {"vocab_size": task.vocab_size}
      architecture = preset(model_config.preset, **{**vocab, **overrides})
    model = Transformer(architecture, rngs=nnx.Rngs(seed))
  if model.config.vocab_size < task.vocab_size:
    raise ValueError(f"The model's vocabulary ({model.config.vocab_size} ids) is smaller than the "
                     f"task tokenizer's ({task.vocab_size}).")
  return model
