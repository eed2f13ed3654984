"""SFT warm start, then RL from outcome reward: readable top to bottom.

  run(config, workdir) -> final metrics

Stage 1 (optional) fits task demonstrations (optionally corrupted, so the
starting policy is imperfect) by cross-entropy until greedy eval accuracy
reaches `sft.target_accuracy` (stopping by accuracy, not step count).
Stage 2 samples `group_size` responses per prompt, scores them, computes
advantages with `config.advantage` and updates `config.objective` (both built
by their `from_config`) for `rl.epochs` passes over `rl.minibatches`
minibatches. KL to the frozen reference enters as an objective term or, with
`rl.kl_reward_coef`, as a per-token reward penalty (rollout.token_rewards).
When `critic.preset` is set, a separate Transformer with a value head
supplies V(s_t) (for GAE and other value-based estimators) and is regressed
towards lambda-returns with its own optimizer. Metrics go to
`workdir/metrics.jsonl` and TensorBoard event files in `workdir/tensorboard`.
"""

import json
import math
import os
import pathlib
import signal
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx
from jax.experimental import multihost_utils
from tensorboardX import SummaryWriter

from jaxcredit import estimators, losses
from jaxcredit.models import Transformer, preset, sharding
from jaxcredit.rollout import Estimate, Rollout
from jaxcredit.sampling import generate
from jaxcredit.tasks import loader
from jaxcredit.train import checkpoints, steps, tasks, workdir_lock


class MetricsWriter:
  """Appends one JSON object per line to workdir/metrics.jsonl (always with
  `step`) and mirrors the scalars to TensorBoard (workdir/tensorboard).

  A fresh run moves an earlier run's file aside (metrics.<mtime>.jsonl); a
  resumed run keeps the lines up to the resumed step and appends after them.
  """

  def __init__(self, workdir: pathlib.Path, *, resume_step: int | None = None):
    self.path = workdir / "metrics.jsonl"
    # On resume, TensorBoard drops the events logged after the checkpoint (they are logged again).
    self.tensorboard = SummaryWriter(str(workdir / "tensorboard"),
                                     purge_step=None if resume_step is None else resume_step + 1)
    if not self.path.exists():
      return
    if resume_step is None:
      kept = self.path.with_name(f"metrics.{int(self.path.stat().st_mtime)}.jsonl")
      self.path.rename(kept)
      print(f"Kept the previous metrics as {kept}.")
      return
    kept_lines = [line for line in _complete_lines(self.path) if json.loads(line)["step"] <= resume_step]
    partial = self.path.with_suffix(".tmp")
    partial.write_text("".join(kept_lines))
    partial.replace(self.path)

  def write(self, step: int, metrics: dict) -> None:
    """Appends one line; a NaN or infinite value is written as null (strict JSON)."""
    values = {k: float(v) for k, v in metrics.items()}
    record = {"step": int(step), **{k: v if math.isfinite(v) else None for k, v in values.items()}}
    with open(self.path, "a") as f:
      f.write(json.dumps(record, allow_nan=False) + "\n")
    for name, value in values.items():
      self.tensorboard.add_scalar(name, value, step)

  def close(self) -> None:
    self.tensorboard.close()


def _complete_lines(path: pathlib.Path) -> list[str]:
  """The lines of a JSONL file, dropping (with a warning) a last line cut off
  mid-write by a crash or a full disk."""
  lines = path.read_text(errors="replace").splitlines(keepends=True)
  if lines:
    try:
      json.loads(lines[-1])
    except json.JSONDecodeError:
      print(f"Dropped the incomplete last line of {path} (a write was cut off): {lines[-1][:80]!r}")
      lines = lines[:-1]
  return [line if line.endswith("\n") else line + "\n" for line in lines]


# Settings a resumed run must share with the run that wrote its checkpoints.
RESUME_FIELDS = ("seed", "task", "model", "critic.preset", "rl.group_size", "rl.prompts_per_step",
                 "advantage", "objective")


def check_resumable(saved: dict, config: dict) -> None:
  """Raises ValueError naming every RESUME_FIELDS entry where `config` differs
  from the workdir's saved config.json (`saved`)."""
  def leaves(tree, prefix=""):
    """{dotted.key: value} of a nested dict."""
    if not isinstance(tree, dict) or not tree:
      return {prefix: tree}
    return {k: v for key, value in tree.items() for k, v in leaves(value, f"{prefix}.{key}".lstrip(".")).items()}

  saved, config = leaves(saved), leaves(config)
  checked = [k for k in sorted(set(saved) | set(config))
             if any(k == field or k.startswith(field + ".") for field in RESUME_FIELDS)]
  differing = [f"{k}: {saved.get(k)!r} -> {config.get(k)!r}" for k in checked if saved.get(k) != config.get(k)]
  if differing:
    raise ValueError("This workdir holds checkpoints of a run with other settings; resume it with the same "
                     "ones or use a new workdir. Differing: " + "; ".join(differing) + ".")


def _positive_int(value, name):
  return isinstance(value, int) and value >= 1, f"{name} must be a positive int, got {value!r}"


def _number_in(value, name, low, high=float("inf"), *, low_open=False):
  ok = isinstance(value, (int, float)) and (value > low if low_open else value >= low) and value <= high
  bounds = f"{'(' if low_open else '['}{low}, {high}]"
  return ok, f"{name} must be a number in {bounds}, got {value!r}"


def validate_config(config) -> None:
  """Raises ValueError naming the field for hyperparameters no run can use."""
  rl, sft = config.rl, config.sft
  problems = [
      _positive_int(rl.group_size, "rl.group_size"), _positive_int(rl.prompts_per_step, "rl.prompts_per_step"),
      _positive_int(rl.epochs, "rl.epochs"), _positive_int(rl.minibatches, "rl.minibatches"),
      _positive_int(rl.eval_every, "rl.eval_every"), _positive_int(sft.batch_size, "sft.batch_size"),
      _positive_int(sft.eval_every, "sft.eval_every"), _positive_int(config.checkpoint.every, "checkpoint.every"),
      _positive_int(config.checkpoint.keep, "checkpoint.keep"),
      (isinstance(rl.steps, int) and rl.steps >= 0, f"rl.steps must be an int >= 0, got {rl.steps!r}"),
      (isinstance(sft.max_steps, int) and sft.max_steps >= 0, f"sft.max_steps must be an int >= 0, got {sft.max_steps!r}"),
      _number_in(rl.learning_rate, "rl.learning_rate", 0.0, low_open=True),
      _number_in(sft.learning_rate, "sft.learning_rate", 0.0, low_open=True),
      _number_in(rl.max_grad_norm, "rl.max_grad_norm", 0.0, low_open=True),
      _number_in(rl.temperature, "rl.temperature", 0.0, low_open=True),
      _number_in(rl.kl_reward_coef, "rl.kl_reward_coef", 0.0),
      _number_in(sft.target_accuracy, "sft.target_accuracy", 0.0, 1.0),
      _number_in(sft.noise, "sft.noise", 0.0, 1.0),
      _number_in(config.task.get("max_dropped_fraction", 0.1), "task.max_dropped_fraction", 0.0, 1.0),
  ]
  truncated_reward = config.task.get("truncated_reward", 0.0)
  problems.append((isinstance(truncated_reward, (int, float)) and math.isfinite(truncated_reward),
                   f"task.truncated_reward must be a finite number, got {truncated_reward!r}"))
  if config.critic.preset:
    problems += [_number_in(config.critic.learning_rate, "critic.learning_rate", 0.0, low_open=True),
                 _number_in(config.critic.gamma, "critic.gamma", 0.0, 1.0),
                 _number_in(config.critic.lam, "critic.lam", 0.0, 1.0)]
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
       f"rl.prompts_per_step * rl.group_size = {rows} is not divisible by rl.minibatches = {rl.minibatches}"),
      (minibatch % rl.group_size == 0,
       f"a minibatch of {minibatch} rows does not hold whole groups of rl.group_size = {rl.group_size}"),
      (minibatch % devices == 0,
       f"a minibatch of {minibatch} rows is not divisible by the {devices} batch-sharded devices"),
      (config.sft.batch_size % devices == 0,
       f"sft.batch_size = {config.sft.batch_size} is not divisible by the {devices} batch-sharded devices"),
  ]
  for ok, message in problems:
    if not ok:
      raise ValueError(message + ".")


def minibatches(rollout: Rollout, estimate: Estimate, count: int, rng: np.random.Generator):
  """`count` minibatches of whole groups (in a random group order when count > 1)."""
  if count == 1:
    yield rollout, estimate
    return
  groups = rollout.tokens.shape[0] // rollout.group_size
  order = rng.permutation(groups)[:, None] * rollout.group_size + np.arange(rollout.group_size)
  for rows in order.reshape(count, -1):
    yield jax.tree.map(lambda x: x[rows], (rollout, estimate))


RolloutHook = Callable[..., tuple[dict, dict]]
"""hook(task, model, rollout, examples, key, rl_step) -> (extras, metrics): runs after
scoring, before the advantages; `extras` are added to rollout.extras (e.g.
Monte-Carlo values for `vineppo`), `metrics` are logged under train/ (a
"gen_tokens" entry is charged to the run's generated-token count). It sees
whole batches, so hooks are single-process."""


def check_rewards(rewards: np.ndarray, *, task: str, rl_step: int) -> None:
  """Raises ValueError naming the task, the step and the rows when a reward is NaN or infinite
  (a normalising estimator would otherwise turn the whole batch's advantages into 0 or NaN)."""
  bad = np.flatnonzero(~np.isfinite(rewards))
  if bad.size:
    raise ValueError(f"Task {task!r} gave non-finite rewards at RL step {rl_step}: row {int(bad[0])} = "
                     f"{rewards[bad[0]]} ({bad.size} of {rewards.size} rows); rewards must be finite numbers.")


def _finite(metrics: dict) -> bool:
  return all(np.isfinite(float(metrics[k])) for k in ("loss", "grad_norm"))


def run(config, workdir: str, *, rollout_hook: RolloutHook | None = None) -> dict:
  """Trains as the module docstring says; returns the final metrics.

  The workdir is locked for the run (a second process refuses at once).
  SIGTERM (preemption) or Ctrl-C during RL finishes the step, saves a
  checkpoint and returns; during SFT, which has no checkpoints, it stops
  cleanly before RL; a second Ctrl-C exits at once. The previous handlers are
  restored on every exit path."""
  validate_config(config)
  workdir = pathlib.Path(workdir)
  checkpoints.check_writable(workdir)
  stops = []

  def stop(signum, _frame):
    if stops and signum == signal.SIGINT:
      print("\nSecond Ctrl-C: exiting without saving.", flush=True)
      os._exit(130)  # at once, whatever Python or orbax is doing
    stops.append(signal.Signals(signum).name)

  previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    with workdir_lock.WorkdirLock(workdir):
      return _run(config, workdir, rollout_hook, stops)
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def _run(config, workdir: pathlib.Path, rollout_hook: RolloutHook | None, preempted: list) -> dict:
  if config.mesh.distributed:
    jax.distributed.initialize()  # one process per host; every host runs this same program
  started_run = time.perf_counter()
  checkpointer = checkpoints.Checkpointer(workdir / "checkpoints", keep=config.checkpoint.keep)
  resuming = checkpointer.latest_step() is not None
  config_json = config.to_json_best_effort(indent=2)
  if resuming and (workdir / "config.json").exists():
    check_resumable(json.loads((workdir / "config.json").read_text()), json.loads(config_json))
    if checkpointer.latest_step() >= config.rl.steps:
      print(f"{workdir} is already at RL step {checkpointer.latest_step()} >= rl.steps = {config.rl.steps}: "
            "nothing to do (config.json left as it was).")
      return {"step": None, "rl_step": checkpointer.latest_step()}
  (workdir / "config.json").write_text(config_json)
  mesh = sharding.make_mesh(config.mesh.shape)
  batch_spec = sharding.batch_sharding(mesh).spec
  check_batch_sizes(config, int(np.prod([mesh.shape[a] for a in batch_spec[0] or ()])))
  # Every process holds its own rows of a global batch (the loader's slice): these
  # assemble them into one global array and take a process's rows back for scoring.
  place = lambda x: multihost_utils.host_local_array_to_global_array(x, mesh, batch_spec)
  local = lambda x: np.asarray(multihost_utils.global_array_to_host_local_array(x, mesh, batch_spec))

  # Data: a procedural TFDS dataset, read by step so that batches are reproducible.
  task = tasks.make(config.task, data_dir=config.task.get("data_dir") or str(workdir / "data"), seed=config.seed)
  data_counts = tasks.check_data(task, max_dropped_fraction=config.task.get("max_dropped_fraction", 0.1))
  actions = tasks.actions(task)
  train = lambda batch_size: loader.Loader(task.sources["train"], encode=task.encode, batch_size=batch_size,
                                            max_prompt_length=task.max_prompt_length, seed=config.seed,
                                            pad_id=task.pad_id)
  sampling = dict(max_new_tokens=task.max_response_length, stop_tokens=task.stop_tokens, pad_id=task.pad_id,
                  action_mask=task.action_mask, hidden=task.hidden, hidden_token=task.hidden_token)
  eval_batch = tasks.evaluation_batch(task)  # each test problem that fits, once
  data_counts["data/test/evaluated"] = len(eval_batch["examples"])
  print(f"Greedy eval on {len(eval_batch['examples'])} held-out problems.")

  def run_eval() -> float:
    """Greedy accuracy (fraction of held-out prompts with reward 1)."""
    sample = generate(model, eval_batch["prompts"], eval_batch["prompt_valid"], jax.random.key(0),
                      temperature=0.0, **sampling)
    return float(np.mean(task.score_rows(sample.tokens, sample.mask, eval_batch["examples"]) >= 1.0))

  model_config = preset(config.model.preset, vocab_size=task.vocab_size, **config.model.get("overrides", {}))
  model = Transformer(model_config, rngs=nnx.Rngs(config.seed))
  sharding.shard_model(model, mesh)  # parameters placed by their logical axes
  rl = config.rl
  adam = lambda lr: optax.chain(optax.clip_by_global_norm(rl.max_grad_norm), optax.adam(lr))
  optimizer = nnx.Optimizer(model, adam(rl.learning_rate), wrt=nnx.Param)
  reference = nnx.clone(model)  # frozen copy of the policy at the start of RL (for KL)
  saved = {"model": model, "reference": reference, "optimizer": optimizer}
  critic = None
  if config.critic.preset:
    critic = Transformer(preset(config.critic.preset, vocab_size=task.vocab_size, value_head=True,
                                **config.model.get("overrides", {})), rngs=nnx.Rngs(config.seed + 1))
    sharding.shard_model(critic, mesh)
    critic_optimizer = nnx.Optimizer(critic, adam(config.critic.learning_rate), wrt=nnx.Param)
    saved.update(critic=critic, critic_optimizer=critic_optimizer)
  # Built before any work, so that an unknown estimator or loss fails at once.
  advantage_fn = jax.jit(estimators.from_config(config.advantage.to_dict()))
  update = steps.rl_step(losses.from_config(config.objective.to_dict()), rl.temperature, actions)


  # Stage 1: supervised warm start, stopped by accuracy (skipped when resuming RL).
  step, first_rl_step, gen_tokens = 0, 0, 0
  if resuming:
    counters = checkpointer.restore(saved, mesh)
    step, first_rl_step, gen_tokens = counters["step"], counters["rl_step"], counters["gen_tokens"]
    print(f"Resuming RL at step {first_rl_step} from {workdir / 'checkpoints'}.")
  writer = MetricsWriter(workdir, resume_step=step if resuming else None)
  accuracy = None
  if not resuming:
    accuracy = run_eval()
    writer.write(step, {"eval/accuracy": accuracy, **data_counts})
  if config.sft.max_steps and not resuming:
    sft_data = train(config.sft.batch_size)
    sft_update = steps.sft_step(actions)
    sft_optimizer = nnx.Optimizer(model, optax.adam(config.sft.learning_rate), wrt=nnx.Param)
    for sft_step in tqdm.trange(config.sft.max_steps, desc="sft", mininterval=2.0):
      batch = sft_data.sft_batch(sft_step, length=task.max_prompt_length + task.max_response_length)
      tokens = tasks.noisy_demonstrations(batch["tokens"], batch["loss_mask"],
                                          np.random.default_rng([config.seed, sft_step]),
                                          rate=config.sft.noise, task=task)
      loss = sft_update(model, sft_optimizer, *map(place, (tokens, batch["loss_mask"], batch["token_valid"])))
      step += 1
      if step % config.sft.eval_every == 0:
        accuracy = run_eval()
        writer.write(step, {"sft/loss": loss, "eval/accuracy": accuracy})
        tqdm.tqdm.write(f"sft step {step:5d} | loss {float(loss):.3f} | eval accuracy {accuracy:.3f}")
        if accuracy >= config.sft.target_accuracy:
          break
      if preempted:
        tqdm.tqdm.write(f"{preempted[0]} during SFT (step {step}): stopped before RL without a checkpoint; "
                        "a rerun starts SFT over.")
        writer.close()
        return {"eval/accuracy": accuracy, "step": step}

  if not resuming:
    nnx.update(reference, nnx.state(model))  # the reference is the post-SFT policy
  started_rl = time.perf_counter()

  # Stage 2: RL from outcome reward.
  reference_logprobs = nnx.jit(lambda ref, rollout: steps.policy_outputs(ref, rollout, rl.temperature,
                                                                           actions).logprobs)
  if critic is not None:
    values_fn = nnx.jit(lambda critic, rollout: steps.critic_values(critic, rollout, actions))
    critic_update = steps.critic_step(clip=config.critic.value_clip, gamma=config.critic.gamma,
                                      lam=config.critic.lam, actions=actions)
  rl_data = train(rl.prompts_per_step)
  key = jax.random.key(config.seed)
  progress = tqdm.tqdm(range(first_rl_step, rl.steps), desc="rl", initial=first_rl_step, total=rl.steps,
                       mininterval=2.0)
  for rl_step in progress:
    checkpointer.check()  # an asynchronous save that failed stops the run here, not one save later
    started = time.perf_counter()
    batch = rl_data.rl_batch(rl_step, group_size=rl.group_size)
    sample = generate(model, place(batch["prompts"]), place(batch["prompt_valid"]),
                      jax.random.fold_in(key, rl_step), temperature=rl.temperature, **sampling)
    scores = task.score_rows(local(sample.tokens), local(sample.mask), batch["examples"])
    check_rewards(scores, task=config.task.name, rl_step=rl_step + 1)
    rollout = Rollout(
        tokens=sample.tokens, mask=sample.mask, rewards=place(scores), logprobs=sample.logprobs,
        entropy=sample.entropy, truncated=sample.truncated, group_size=rl.group_size,
        extras={"positions": sample.positions, "token_valid": sample.token_valid},
    )
    rollout = rollout.replace(ref_logprobs=reference_logprobs(reference, rollout))
    if rl.kl_reward_coef:  # KL as a reward penalty, read by return-based estimators
      rollout = rollout.replace(token_rewards=losses.kl_reward_shaping(
          jnp.zeros(rollout.mask.shape), rollout.logprobs, rollout.ref_logprobs, rollout.mask,
          coef=rl.kl_reward_coef, kind=rl.kl_reward_kind))
    if critic is not None:
      rollout = rollout.replace(values=values_fn(critic, rollout))
    record = {}
    if rollout_hook is not None:
      extras, hook_metrics = rollout_hook(task, model, rollout, batch["examples"],
                                          jax.random.fold_in(jax.random.key(config.seed + 1), rl_step), rl_step)
      rollout = rollout.replace(extras={**rollout.extras, **extras})
      gen_tokens += int(hook_metrics.get("gen_tokens", 0))
      record.update({f"train/hook/{k}": v for k, v in hook_metrics.items()})
    estimate = advantage_fn(rollout)
    for epoch in range(rl.epochs):
      rng = np.random.default_rng([config.seed, rl_step, epoch])
      for mini_rollout, mini_estimate in minibatches(rollout, estimate, rl.minibatches, rng):
        metrics = update(model, optimizer, mini_rollout, mini_estimate, rl_step)
        if critic is not None:
          record.update({f"train/critic/{k}": v for k, v in
                         critic_update(critic, critic_optimizer, mini_rollout).items()})
    if not _finite(metrics):
      checkpointer.wait()
      raise FloatingPointError(
          f"Non-finite loss ({float(metrics['loss'])}) or gradient norm ({float(metrics['grad_norm'])}) at RL "
          f"step {rl_step + 1}; stopped without saving. " + (
              f"The last good checkpoint is step {checkpointer.latest_step()} in {workdir / 'checkpoints'}."
              if checkpointer.latest_step() is not None else "No checkpoint had been written yet."))
    step += 1
    generated = int(jnp.sum(sample.mask))
    gen_tokens += generated
    record.update({f"train/{k}": v for k, v in metrics.items()})
    record.update({
        "train/reward_mean": jnp.mean(rollout.rewards),
        "train/truncated": jnp.mean(sample.truncated),  # fraction cut off by the budget (scored by the task rule)
        "train/entropy": losses.aggregate(sample.entropy, sample.mask, "token-mean"),
        "train/kl": losses.aggregate(losses.kl_penalty(
            rollout.logprobs, rollout.ref_logprobs, kind="k3"), rollout.mask, "token-mean"),
        "train/tokens_per_sec": generated / (time.perf_counter() - started),
        "train/gen_tokens": gen_tokens,  # cumulative: policy samples and any hook's rollouts
        "train/kl_reward_penalty": 0.0 if rollout.token_rewards is None else -losses.aggregate(
            rollout.token_rewards, rollout.mask, "token-mean"),
    })
    record.update({f"train/{k}": v for k, v in estimators.signal_diagnostics(
        rollout.rewards, estimate.advantages, rollout.mask, group_size=rl.group_size).items()
        if jnp.ndim(v) == 0})
    if (rl_step + 1) % rl.eval_every == 0 or rl_step + 1 == rl.steps:
      accuracy = run_eval()
      record["eval/accuracy"] = accuracy
      tqdm.tqdm.write(f"rl step {rl_step + 1:5d} | reward {record['train/reward_mean']:.3f} | "
                      f"kl {float(record['train/kl']):.4f} | entropy {record['train/entropy']:.3f} | "
                      f"eval accuracy {accuracy:.3f} | {record['train/tokens_per_sec']:,.0f} tok/s")
    progress.set_postfix(reward=f"{record['train/reward_mean']:.3f}", kl=f"{float(record['train/kl']):.4f}",
                         accuracy=accuracy, refresh=False)
    writer.write(step, record)
    if preempted or (rl_step + 1) % config.checkpoint.every == 0 or rl_step + 1 == rl.steps:
      checkpointer.save(rl_step + 1, saved, {"rl_step": rl_step + 1, "step": step, "gen_tokens": gen_tokens}, mesh)
    if preempted:
      tqdm.tqdm.write(f"{preempted[0]}: saved a checkpoint at RL step {rl_step + 1}; rerun to resume.")
      break
  progress.close()
  checkpointer.wait()
  writer.close()
  if accuracy is None:
    accuracy = run_eval()
  now = time.perf_counter()
  # Wall time of this process (a resumed run counts only its own part); set-up and compilation included.
  return {"eval/accuracy": accuracy, "step": step, "seconds": round(now - started_run, 1),
          "seconds_before_rl": round(started_rl - started_run, 1), "seconds_rl": round(now - started_rl, 1)}
