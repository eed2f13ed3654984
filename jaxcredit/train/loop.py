"""SFT warm start, then RL from outcome reward: readable top to bottom.

  run(config, workdir) -> final metrics

Stage 1 (optional) fits task demonstrations (optionally corrupted, so the
starting policy is imperfect) by cross-entropy until greedy eval accuracy
reaches `sft.target_accuracy` (stopping by accuracy, not step count).
Stage 2 repeats: a rollout source (`jaxcredit.rollout_sources.SingleTurn`, or
`MultiTurn` for a task with an environment) samples `group_size` responses
(episodes) per prompt and scores them; the extras providers the
estimators need (`jaxcredit.credit.extras`, e.g. Monte-Carlo values for
`vineppo`) and an optional rollout hook add extras; the learner step
(`jaxcredit.train.learner`: reference log-probs,
KL penalty, critic values, `config.advantage`, `rl.epochs x rl.minibatches`
updates of `config.objective`), then log and checkpoint. When
`critic.preset` is set, a separate Transformer with a value head supplies
V(s_t) and is regressed towards lambda-returns with its own optimizer.
Metrics go to `workdir/metrics.jsonl` and TensorBoard (`train.metrics`). Everything the
run reads (task, models, learner step, checkpoint state) is built once by
`jaxcredit.train.setup.build`.
"""

import contextlib
import os
import pathlib
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx
from jax.experimental import multihost_utils

from jaxcredit import forward
from jaxcredit.credit import extras
from jaxcredit.models import huggingface
from jaxcredit.rollout import Rollout
from jaxcredit.sampling import tree
from jaxcredit.train import (
  checkpoints,
  data,
  learner,
  multihost,
  refusals,
  setup,
  staleness,
  workdir_lock,
)

def run(config, workdir: str, *, rollout_hook: extras.Hook | None = None) -> dict:
  """Trains as the module docstring says.

  The workdir is locked for the run (a second process refuses at once). SIGTERM
  (preemption) or Ctrl-C during RL finishes the step, saves a checkpoint and returns; during
  SFT, which has no checkpoints, it stops cleanly before RL; a second Ctrl-C exits at once.

  Args:
    config: the run's config (`base_config.get_config()` with overrides).
    workdir: where metrics, checkpoints and exports go; a workdir with checkpoints resumes.
    rollout_hook: a hook run after the extras providers, before each learner step
      (`credit.extras.Hook`), or None.

  Returns:
    the final metrics, with "stopped": whether a signal ended the run before its last step.

  Raises:
    ValueError: naming the field for a config no run can use, before any work.
  """
  refusals.validate_config(config)
  workdir = pathlib.Path(workdir)
  checkpoints.check_writable(workdir)
  if config.mesh.distributed:  # one process per host; every host runs this same program
    multihost.connect(config.mesh)
    # Open the CPU collectives while every process is at the same point: gloo
    # allows 30 s for a first rendezvous, less than process 0's data preparation
    # can take, and reuses the connection afterwards.
    multihost_utils.sync_global_devices("jaxcredit: connected")
  with (_stop_signals() as stops, workdir_lock.WorkdirLock(workdir, jax.process_index()),
        contextlib.ExitStack() as scope):
    started, rl = time.perf_counter(), config.rl
    trainer = setup.build(config, workdir)
    if trainer is None:  # already finished
      return {"step": None, "stopped": False}
    scope.enter_context(jax.set_mesh(trainer.mesh))  # the model reads the `sequence` axis from it
    accuracy, stopped = (None, False) if trainer.resumed else _warm_start(trainer, stops)
    if stopped:  # during SFT
      return {"eval/accuracy": accuracy, "step": trainer.counters["step"], "stopped": True}
    started_rl, key = time.perf_counter(), jax.random.key(config.seed)
    add_extras = extras.chain(trainer.provide_extras, rollout_hook)
    progress = tqdm.tqdm(range(trainer.counters["rl_step"], rl.steps), desc="rl",
                         initial=trainer.counters["rl_step"], total=rl.steps, mininterval=2.0)
    sampled = None  # with a sampler of its own: the next update's batch, sampled already
    for rl_step in progress:
      # An asynchronous save that failed stops the run here, not one save later.
      trainer.checkpointer.check()
      step_started = time.perf_counter()
      batch, rollout = sampled or trainer.sample(rl_step, key)
      reward_failures = _reward_failures(trainer, rl_step)
      if trainer.sampler is not None and trainer.sampler.due(rl_step):
        trainer.sampler.push(trainer.modules["model"])
      rollout, record = _add_extras(trainer, rollout, batch, rl_step, add_extras)
      orders = learner.minibatch_orders(rollout.tokens.shape[0], rl.group_size, rl.epochs,
                                        rl.minibatches, config.seed, rl_step)
      before_update = trainer.stale.capture(trainer.modules["model"])
      if rl.report_memory and rl_step == progress.initial:
        _report_memory(trainer.learner_step, nnx.state(trainer.modules), rollout, orders, rl_step)
      state, update_metrics = trainer.learner_step(nnx.state(trainer.modules), rollout, orders,
                                                   rl_step)
      # Per-token export, off this thread.
      if trainer.exporter is not None and trainer.exporter.due(rl_step):
        record["train/export_wait_ms"] = _export_tokens(trainer, rl_step, rollout, batch, state)
      # Dispatched, not finished: the sampler's devices sample the next batch meanwhile.
      sampled = (trainer.sample(rl_step + 1, key)
                 if trainer.sampler is not None and rl_step + 1 < rl.steps and not stops else None)
      _check_finite(update_metrics, rl_step, trainer)
      nnx.update(trainer.modules, state)
      trainer.stale.push(before_update)
      generated = int(jnp.sum(rollout.mask) if "tree_path" not in rollout.extras else
                      tree.generated_tokens(rollout.extras["tree_path"],
                                            rollout.extras["tree_segments"], rollout.mask))
      trainer.counters.update(rl_step=rl_step + 1, step=trainer.counters["step"] + 1,
                        gen_tokens=trainer.counters["gen_tokens"] + generated)
      record.update({f"train/{k}": v for k, v in update_metrics.items()})
      # truncated: cut off by the budget (the task's rule scored it); gen_tokens:
      # cumulative, hooks' rollouts included.
      record.update({"train/truncated": jnp.mean(rollout.truncated),
                     "train/reward_failures": reward_failures,
                     "train/tokens_per_sec": generated / (time.perf_counter() - step_started),
                     "train/gen_tokens": trainer.counters["gen_tokens"]})
      if (rl_step + 1) % rl.eval_every == 0 or rl_step + 1 == rl.steps:
        accuracy = record["eval/accuracy"] = trainer.evaluate()
        _report(rl_step + 1, record)
      progress.set_postfix(reward=f"{record['train/reward_mean']:.3f}",
                           kl=f"{float(record['train/kl']):.4f}", accuracy=accuracy, refresh=False)
      trainer.writer.write(trainer.counters["step"], record)
      # Read once: a signal arriving between the save and the message waits for the next
      # step, rather than being reported as saved when the save had already been passed by.
      stopping = bool(stops)
      if stopping or (rl_step + 1) % config.checkpoint.every == 0 or rl_step + 1 == rl.steps:
        trainer.save(rl_step + 1)
      if stopping:
        tqdm.tqdm.write(
            f"{stops[0]}: saved a checkpoint at RL step {rl_step + 1}; rerun to resume.")
        break
    progress.close()
    trainer.checkpointer.wait()
    if trainer.exporter is not None:
      trainer.exporter.close()
    trainer.writer.close()
    _export_hf(trainer)
    accuracy = trainer.evaluate() if accuracy is None else accuracy
    now = time.perf_counter()
    # Wall time of this process (a resumed run counts only its own part); set-up and
    # compilation included.
    return {
        "eval/accuracy": accuracy,
        "step": trainer.counters["step"],
        "seconds": round(now - started, 1),
        "seconds_before_rl": round(started_rl - started, 1),
        "seconds_rl": round(now - started_rl, 1),
        "stopped": trainer.counters["rl_step"] < rl.steps,
    }


@contextlib.contextmanager
def _stop_signals():
  """Yields a list that SIGTERM or Ctrl-C appends its name to (the loop stops
  after the step); a second Ctrl-C exits at once. Previous handlers are restored."""
  stops = []

  def stop(signum, _frame):
    if stops and signum == signal.SIGINT:
      print("\nSecond Ctrl-C: exiting without saving.", flush=True)
      os._exit(130)  # at once, whatever Python or orbax is doing
    stops.append(signal.Signals(signum).name)

  previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield stops
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def _warm_start(trainer: setup.Trainer, stops: list) -> tuple[float, bool]:
  """Stage 1: greedy eval of the initial policy, then SFT until `sft.target_accuracy`;
  the reference becomes the post-SFT policy. Returns (accuracy, whether a stop
  signal ended SFT)."""
  config, model = trainer.config, trainer.modules["model"]
  accuracy = trainer.evaluate()
  trainer.writer.write(0, {"eval/accuracy": accuracy, **trainer.data_counts})
  if config.sft.max_steps:
    sft_data = trainer.train_loader(config.sft.batch_size)
    sft_update = forward.sft_step(trainer.task.actions, trainer.config.rl.logits_per_chunk)
    sft_optimizer = nnx.Optimizer(model, optax.adam(config.sft.learning_rate), wrt=nnx.Param)
    for sft_step in tqdm.trange(config.sft.max_steps, desc="sft", mininterval=2.0):
      batch = sft_data.sft_batch(
          sft_step, length=trainer.task.max_prompt_length + trainer.task.max_response_length)
      loss_mask = trainer.task.sft_loss_mask(batch["tokens"], batch["loss_mask"])
      tokens = data.noisy_demonstrations(batch["tokens"], loss_mask,
                                          np.random.default_rng([config.seed, sft_step]),
                                          rate=config.sft.noise, task=trainer.task)
      loss = sft_update(model, sft_optimizer,
                        *map(trainer.place, (tokens, loss_mask, batch["token_valid"])))
      step = trainer.counters["step"] = sft_step + 1
      if step % config.sft.eval_every == 0:
        accuracy = trainer.evaluate()
        trainer.writer.write(step, {"sft/loss": loss, "eval/accuracy": accuracy})
        tqdm.tqdm.write(
            f"sft step {step:5d} | loss {float(loss):.3f} | eval accuracy {accuracy:.3f}")
        if accuracy >= config.sft.target_accuracy:
          break
      if stops:
        tqdm.tqdm.write(
            f"{stops[0]} during SFT (step {step}): stopped before RL without a checkpoint; "
            "a rerun starts SFT over.")
        trainer.writer.close()
        return accuracy, True
  nnx.update(trainer.modules["reference"], nnx.state(model))  # the reference is the post-SFT policy
  trainer.stale.reset(model)  # and so are the parameters stale rollouts start from
  if trainer.provide_extras is not None:  # and the providers' state (PRIME's PRM starts as it)
    trainer.provide_extras.start(model)
  if trainer.sampler is not None:
    trainer.sampler.push(model)
  return accuracy, False


def _add_extras(trainer: setup.Trainer, rollout: Rollout, batch: dict, rl_step: int,
                hook: extras.Hook | None) -> tuple[Rollout, dict]:
  """The rollout with the reference log-probs (PRIME's implicit PRM reads them)
  and the hook's extras (none without a hook); its metrics as train/hook/..."""
  if hook is None:
    return rollout, {}
  rollout = rollout.replace(
      ref_logprobs=trainer.reference_logprobs(trainer.modules["reference"], rollout))
  key = jax.random.fold_in(jax.random.key(trainer.config.seed + 1), rl_step)
  context = extras.Context(trainer.task, trainer.modules["model"], batch["examples"], key, rl_step)
  more_extras, metrics = hook(context, rollout)
  rollout = rollout.replace(extras={**rollout.extras, **more_extras})
  trainer.counters["gen_tokens"] += int(metrics.get("gen_tokens", 0))
  return rollout, {f"train/hook/{k}": v for k, v in metrics.items()}


def _export_tokens(trainer: setup.Trainer, rl_step: int, rollout: Rollout, batch: dict,
                   state) -> float:
  """Queues update rl_step's per-token export (train.export) with the modules' states before
  (still in trainer.modules) and after (`state`) the update; the milliseconds this thread waited."""
  waited = trainer.exporter.submit(
      step=trainer.counters["step"] + 1, rl_step=rl_step, rollout=rollout,
      examples=batch["examples"],
      before=staleness.snapshot(nnx.state(trainer.modules)), after=staleness.snapshot(state),
      key=jax.random.fold_in(jax.random.key(trainer.config.seed + 2), rl_step))
  return 1e3 * waited


def _export_hf(trainer: setup.Trainer) -> None:
  """With export.hf, WORKDIR/hf holds the finished policy as a transformers checkpoint
  (`models.huggingface.save_hf_checkpoint`; written by process 0 from gathered weights)."""
  if not trainer.config.export.hf or trainer.counters["rl_step"] < trainer.config.rl.steps:
    return
  model = trainer.modules["model"]
  if jax.process_count() > 1:
    model = nnx.clone(model)
    state = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: multihost_utils.process_allgather(x, tiled=True),
                                   state))
  if jax.process_index() == 0:
    directory = huggingface.save_hf_checkpoint(model, trainer.workdir / "hf",
                                              tokenizer=setup.tokenizer_directory(trainer.config),
                                              stop_tokens=trainer.task.stop_tokens)
    print(f"Exported the policy to {directory} (transformers format).")


def _reward_failures(trainer: setup.Trainer, rl_step: int) -> int:
  """How many responses scored since the last call (this batch's, and any continuations
  scored for the previous update's extras) got 0 because the reward function raised; each
  such batch is reported. When they are task.max_reward_failures of those scored or more,
  the run saves a checkpoint of the updates so far and stops (ValueError)."""
  failed, scored, reason = trainer.task.reward_failures.take()
  if not failed:
    return 0
  tqdm.tqdm.write(f"RL step {rl_step + 1}: the reward function raised on {failed} of {scored} "
                  f"responses, scored 0 (first: {reason}).")
  limit = trainer.config.task.max_reward_failures
  if failed < limit * scored:
    return failed
  if rl_step > (trainer.checkpointer.latest_step() or 0):
    trainer.save(rl_step)
  trainer.checkpointer.wait()
  raise ValueError(
      f"At RL step {rl_step + 1} the reward function raised on {failed} of {scored} responses, "
      f"at least task.max_reward_failures = {limit} of them (first: {reason}). Fix the reward "
      f"function and rerun to resume from RL step {trainer.checkpointer.latest_step() or 0}.")


def _report_memory(step, *args) -> None:
  """Prints the memory per device of `step`(*args)'s compiled program (`rl.report_memory`)."""
  stats = step.lower(*args).compile().memory_analysis()
  if stats is None:
    print("Learner step memory: this backend does not report it.", flush=True)
    return
  gib = lambda n: f"{n / 2**30:.4g} GiB"
  print(f"Learner step memory per device ({jax.device_count()} devices): arguments "
        f"{gib(stats.argument_size_in_bytes)}, outputs {gib(stats.output_size_in_bytes)}, "
        f"temporaries {gib(stats.temp_size_in_bytes)} (XLA's memory_analysis of the compiled "
        "step).", flush=True)


def _check_finite(update_metrics: dict, rl_step: int, trainer: setup.Trainer) -> None:
  """FloatingPointError naming the step and the last good checkpoint when the loss or gradient
  is not finite."""
  loss, grad_norm = float(update_metrics["loss"]), float(update_metrics["grad_norm"])
  if np.isfinite(loss) and np.isfinite(grad_norm):
    return
  trainer.checkpointer.wait()
  latest = trainer.checkpointer.latest_step()
  raise FloatingPointError(
      f"Non-finite loss ({loss}) or gradient norm ({grad_norm}) at RL step {rl_step + 1}; "
      "stopped without saving. "
      + (f"The last good checkpoint is step {latest} in {trainer.workdir / 'checkpoints'}."
         if latest is not None else "No checkpoint had been written yet."))


def _report(rl_step: int, record: dict) -> None:
  tqdm.tqdm.write(
      f"rl step {rl_step:5d} | reward {record['train/reward_mean']:.3f} | "
      f"kl {float(record['train/kl']):.4f} | entropy {record['train/entropy']:.3f} | "
      f"eval accuracy {record['eval/accuracy']:.3f} | {record['train/tokens_per_sec']:,.0f} tok/s")
