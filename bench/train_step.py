"""RL step throughput on the quickstart task, split into sampling / scoring / update.

python -m bench.train_step [--prompts 32 --group 8 --repeats 5]

One step = KV-cache sampling of prompts x group responses, host-side reward
scoring, reference log-probs + GRPO advantages, and one PPO-clip update. The
baseline is the same step with the no-cache sampler (re-running the whole
prefix at every decode step), measured in the same run.
"""

import argparse
import tempfile
import time

import jax
import ml_collections
import numpy as np
import optax
from flax import nnx

from bench.common import machine, table
from bench.no_cache import generate_without_cache
from jaxcredit import estimators, losses, tasks
from jaxcredit.models import Transformer, preset
from jaxcredit.rollout import Rollout
from jaxcredit.sampling import generate
from jaxcredit.tasks import loader
from jaxcredit.train import learner


def _task(directory: str):
  config = ml_collections.ConfigDict({
      "name": "arithmetic", "options": {"min_digits": 2, "max_digits": 3, "reverse_answer": True},
      "train_size": 2000, "test_size": 8, "max_prompt_length": 10, "max_response_length": 6,
  })
  return tasks.make(config, data_dir=directory, seed=0)


def _timed(fn):
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - start


def measure(
  task, preset_name: str, *, prompts: int, group: int, repeats: int, use_cache: bool
) -> dict:
  """Median seconds per phase and generated tokens per step."""
  model = Transformer(preset(preset_name, vocab_size=task.vocab_size), rngs=nnx.Rngs(0))
  modules = {
    "model": model,
    "optimizer": nnx.Optimizer(model, optax.adam(1e-4), wrt=nnx.Param),
    "reference": nnx.clone(model),
  }
  graphdef, _ = nnx.split(modules)
  learner_step = learner.make_step(
    graphdef,
    advantage=estimators.from_config("grpo"),
    objective=losses.from_config({"policy": {"name": "ppo_clip"}}),
    settings=learner.Settings(),
  )
  data = loader.Loader(
    task.sources["train"],
    encode=task.encode,
    batch_size=prompts,
    max_prompt_length=task.max_prompt_length,
    pad_id=task.pad_id,
  )
  phases = {"sampling": [], "scoring": [], "update": []}
  generated = []
  for step in range(repeats + 1):  # step 0 compiles
    batch = data.rl_batch(step, group_size=group)
    sample, t_sample = _timed(
      lambda: (generate if use_cache else generate_without_cache)(
        model,
        batch["prompts"],
        batch["prompt_valid"],
        jax.random.key(step),
        max_new_tokens=task.max_response_length,
        stop_tokens=task.stop_tokens,
        pad_id=task.pad_id,
      )
    )
    scores, t_score = _timed(lambda: task.score_rows(sample.tokens, sample.mask, batch["examples"]))
    rollout = Rollout(
      tokens=sample.tokens,
      mask=sample.mask,
      rewards=scores,
      behaviour_logprobs=sample.logprobs,
      group_size=group,
      positions=sample.positions,
      token_valid=sample.token_valid,
    )

    (state, _), t_update = _timed(lambda: learner_step(nnx.state(modules), rollout, None, step))
    nnx.update(modules, state)
    if step:
      for name, seconds in zip(phases, (t_sample, t_score, t_update)):
        phases[name].append(seconds)
      generated.append(int(np.asarray(sample.mask).sum()))
  return {
    **{k: float(np.median(v)) for k, v in phases.items()},
    "tokens": float(np.mean(generated)),
  }


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--prompts", type=int, default=32)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  print(f"# RL step benchmark\n\nmachine: {machine()}\n")
  print(
    f"arithmetic (quickstart task), {args.prompts} prompts x {args.group} responses, "
    "up to 6 new tokens, "
    f"GRPO + PPO-clip, float32; median of {args.repeats} steps after one compile step\n"
  )
  rows = []
  with tempfile.TemporaryDirectory() as directory:
    task = _task(directory)
    for name in ("tiny", "small"):
      for use_cache in (True, False):
        r = measure(
          task,
          name,
          prompts=args.prompts,
          group=args.group,
          repeats=args.repeats,
          use_cache=use_cache,
        )
        total = r["sampling"] + r["scoring"] + r["update"]
        rows.append(
          [
            name,
            "jaxcredit (KV cache)" if use_cache else "baseline: no-cache sampler",
            f"{1e3 * r['sampling']:.1f}",
            f"{1e3 * r['scoring']:.1f}",
            f"{1e3 * r['update']:.1f}",
            f"{1e3 * total:.1f}",
            f"{r['tokens'] / total:,.0f}",
          ]
        )
  print(
    table(
      [
        "model",
        "step",
        "sampling (ms)",
        "scoring (ms)",
        "update (ms)",
        "total (ms)",
        "generated tok/s",
      ],
      rows,
    )
  )


if __name__ == "__main__":
  main()
