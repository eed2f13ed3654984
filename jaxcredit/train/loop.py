"""SFT warm start, then RL from outcome reward: readable top to bottom.

  run(config, workdir) -> final metrics

Stage 1 (optional) fits task demonstrations by cross-entropy until greedy
eval accuracy reaches `sft.target_accuracy` (stopping by accuracy, not step
count). Stage 2 samples `group_size` responses per prompt, scores them,
computes advantages with `config.advantage` and updates `config.objective`
(both built by their `from_config`). Metrics go to `workdir/metrics.jsonl`.
"""

import json
import pathlib
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxcredit import estimators, losses
from jaxcredit.models import Transformer, preset, sharding
from jaxcredit.rollout import Rollout
from jaxcredit.sampling import generate
from jaxcredit.tasks import CharTokenizer, arithmetic, builders, loader, rewards
from jaxcredit.train import checkpoints, steps


class MetricsWriter:
  """Appends one JSON object per line to workdir/metrics.jsonl (always with `step`).

  A fresh run moves an earlier run's file aside (metrics.<mtime>.jsonl); a
  resumed run keeps the lines up to the resumed step and appends after them.
  """

  def __init__(self, workdir: pathlib.Path, *, resume_step: int | None = None):
    self.path = workdir / "metrics.jsonl"
    if not self.path.exists():
      return
    if resume_step is None:
      kept = self.path.with_name(f"metrics.{int(self.path.stat().st_mtime)}.jsonl")
      self.path.rename(kept)
      print(f"Kept the previous metrics as {kept}.")
      return
    lines = self.path.read_text().splitlines(keepends=True)
    kept_lines = [line for line in lines if json.loads(line)["step"] <= resume_step]
    partial = self.path.with_suffix(".tmp")
    partial.write_text("".join(kept_lines))
    partial.replace(self.path)

  def write(self, step: int, metrics: dict) -> None:
    record = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")


def _responses(sample, tokenizer) -> list[str]:
  tokens, mask = np.asarray(sample.tokens), np.asarray(sample.mask)
  return [tokenizer.decode(row[m]) for row, m in zip(tokens, mask)]


def _answers(examples) -> list[str]:
  return [e["answer"].decode() if isinstance(e["answer"], bytes) else e["answer"] for e in examples]


def evaluate(model, prompts, prompt_valid, answers, tokenizer, max_new_tokens) -> float:
  """Greedy accuracy on held-out prompts."""
  sample = generate(model, prompts, prompt_valid, jax.random.key(0), max_new_tokens=max_new_tokens,
                    temperature=0.0, stop_tokens=(tokenizer.eos_id,), pad_id=tokenizer.pad_id)
  scores, _ = rewards.batched(arithmetic.reward, _responses(sample, tokenizer), answers)
  return float(scores.mean())


def run(config, workdir: str) -> dict:
  if config.mesh.distributed:
    jax.distributed.initialize()  # one process per host; every host runs this same program
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
  tokenizer = CharTokenizer(arithmetic.ALPHABET)

  # Data: a procedural TFDS dataset, read by step so that batches are reproducible.
  task = arithmetic.ArithmeticConfig(**config.task.arithmetic.to_dict())
  builder = builders.get("arithmetic", data_dir=str(workdir / "data"),
                         config=builders.ProceduralConfig(name="run", task=task),
                         train_size=config.task.train_size, test_size=config.task.test_size,
                         seed=config.seed)
  builder.download_and_prepare()
  sources = builder.as_data_source()
  encode = loader.text_encoder(tokenizer)
  max_prompt = config.task.max_prompt_length
  train = lambda batch_size: loader.Loader(sources["train"], encode=encode, batch_size=batch_size,
                                            max_prompt_length=max_prompt, seed=config.seed)
  test_examples = [sources["test"][i] for i in range(len(sources["test"]))]
  eval_prompts, eval_valid = tokenizer.encode_batch(
      [e["prompt"].decode() for e in test_examples], length=max_prompt, add_bos=True)
  eval_answers = _answers(test_examples)
  max_new = config.task.max_response_length
  run_eval = lambda: evaluate(model, eval_prompts, eval_valid, eval_answers, tokenizer, max_new)

  model = Transformer(preset(config.model.preset, vocab_size=tokenizer.vocab_size),
                      rngs=nnx.Rngs(config.seed))
  mesh = sharding.make_mesh(config.mesh.shape)
  sharding.shard_model(model, mesh)  # parameters placed by their logical axes
  place = lambda x: jax.device_put(x, sharding.batch_sharding(mesh))  # batch axis over data x fsdp
  rl = config.rl
  optimizer = nnx.Optimizer(
      model, optax.chain(optax.clip_by_global_norm(rl.max_grad_norm), optax.adam(rl.learning_rate)),
      wrt=nnx.Param)
  reference = nnx.clone(model)  # frozen copy of the policy at the start of RL (for KL)
  checkpointer = checkpoints.Checkpointer(workdir / "checkpoints", keep=config.checkpoint.keep)
  saved = {"model": model, "reference": reference, "optimizer": optimizer}
  resuming = checkpointer.latest_step() is not None

  # Stage 1: supervised warm start, stopped by accuracy (skipped when resuming RL).
  step, first_rl_step = 0, 0
  if resuming:
    counters = checkpointer.restore(saved)
    step, first_rl_step = counters["step"], counters["rl_step"]
    print(f"Resuming RL at step {first_rl_step} from {workdir / 'checkpoints'}.")
  writer = MetricsWriter(workdir, resume_step=step if resuming else None)
  if not resuming:
    writer.write(step, {"eval/accuracy": run_eval()})
  accuracy = None
  if config.sft.max_steps and not resuming:
    sft_data = train(config.sft.batch_size)
    sft_optimizer = nnx.Optimizer(model, optax.adam(config.sft.learning_rate), wrt=nnx.Param)
    for sft_step in range(config.sft.max_steps):
      batch = sft_data.sft_batch(sft_step, length=max_prompt + max_new)
      loss = steps.sft_step(model, sft_optimizer, *map(place, (batch["tokens"], batch["loss_mask"],
                                                                 batch["token_valid"])))
      step += 1
      if step % config.sft.eval_every == 0:
        accuracy = run_eval()
        writer.write(step, {"sft/loss": loss, "eval/accuracy": accuracy})
        print(f"sft step {step:5d} | loss {float(loss):.3f} | eval accuracy {accuracy:.3f}", flush=True)
        if accuracy >= config.sft.target_accuracy:
          break

  if not resuming:
    nnx.update(reference, nnx.state(model))  # the reference is the post-SFT policy

  # Stage 2: RL from outcome reward. SIGTERM (preemption) saves a checkpoint and returns.
  preempted = []
  previous_handler = signal.signal(signal.SIGTERM, lambda *_: preempted.append(True))
  advantage_fn = jax.jit(estimators.from_config(config.advantage.to_dict()))
  update = steps.rl_step(losses.from_config(config.objective.to_dict()), rl.temperature)
  reference_logprobs = nnx.jit(lambda ref, rollout: steps.policy_outputs(ref, rollout, rl.temperature).logprobs)
  rl_data = train(rl.prompts_per_step)
  key = jax.random.key(config.seed)
  for rl_step in range(first_rl_step, rl.steps):
    started = time.perf_counter()
    batch = rl_data.rl_batch(rl_step, group_size=rl.group_size)
    sample = generate(model, place(batch["prompts"]), place(batch["prompt_valid"]),
                      jax.random.fold_in(key, rl_step),
                      max_new_tokens=max_new, temperature=rl.temperature,
                      stop_tokens=(tokenizer.eos_id,), pad_id=tokenizer.pad_id)
    scores, _ = rewards.batched(arithmetic.reward, _responses(sample, tokenizer), _answers(batch["examples"]))
    rollout = Rollout(
        tokens=sample.tokens, mask=sample.mask, rewards=jnp.asarray(scores), logprobs=sample.logprobs,
        entropy=sample.entropy, group_size=rl.group_size,
        extras={"positions": sample.positions, "token_valid": sample.token_valid},
    )
    rollout = rollout.replace(ref_logprobs=reference_logprobs(reference, rollout))
    estimate = advantage_fn(rollout)
    for _ in range(rl.epochs):
      metrics = update(model, optimizer, rollout, estimate, rl_step)
    step += 1
    generated = int(np.asarray(sample.mask).sum())
    record = {f"train/{k}": v for k, v in metrics.items()}
    record.update({
        "train/reward_mean": scores.mean(),
        "train/entropy": float(np.asarray(sample.entropy)[np.asarray(sample.mask)].mean()),
        "train/kl": losses.aggregate(losses.kl_penalty(
            rollout.logprobs, rollout.ref_logprobs, kind="k3"), rollout.mask, "token-mean"),
        "train/tokens_per_sec": generated / (time.perf_counter() - started),
    })
    record.update({f"train/{k}": v for k, v in estimators.signal_diagnostics(
        rollout.rewards, estimate.advantages, rollout.mask, group_size=rl.group_size).items()
        if jnp.ndim(v) == 0})
    if (rl_step + 1) % rl.eval_every == 0 or rl_step + 1 == rl.steps:
      accuracy = run_eval()
      record["eval/accuracy"] = accuracy
      print(f"rl step {rl_step + 1:5d} | reward {record['train/reward_mean']:.3f} | "
            f"kl {float(record['train/kl']):.4f} | entropy {record['train/entropy']:.3f} | "
            f"eval accuracy {accuracy:.3f} | {record['train/tokens_per_sec']:,.0f} tok/s", flush=True)
    writer.write(step, record)
    if preempted or (rl_step + 1) % config.checkpoint.every == 0 or rl_step + 1 == rl.steps:
      checkpointer.save(rl_step + 1, saved, {"rl_step": rl_step + 1, "step": step})
    if preempted:
      print(f"SIGTERM: saved a checkpoint at RL step {rl_step + 1}; rerun to resume.")
      break
  checkpointer.wait()
  signal.signal(signal.SIGTERM, previous_handler)
  if accuracy is None:
    accuracy = run_eval()
  return {"eval/accuracy": accuracy, "step": step}
