"""Training with each sampling engine: the time of an RL step of the shipped configs with the
static sampler, continuous batching and continuous batching with partial rollouts.

    python -m bench.engines [--configs countdown_continuous calculator_grpo] [--steps 12]
        [--warmup 4] [--out bench/results/engines.md]

Each run trains the config as shipped (its SFT warm start included, not timed; greedy
evaluation on 100 held-out problems instead of 500, which SFT's stopping rule reads every 10
steps) for `--steps` RL steps with `rollout.engine` (and `rollout.partial_decode_steps`) set
per row, on the same seed. The time of an RL step is the interval between consecutive metric
writes (sampling, scoring and the update), median over the steps after the first `--warmup`
(which compile); generated tok/s are the tokens generated over those steps
(`train/gen_tokens`, a running count) over their wall time. The engines draw other responses
(per-response keys), and the policies then drift apart, so the tokens a step generates
differ between rows: tokens/s is the comparison, the step time its context.
"""

import argparse
import pathlib
import tempfile
import time

import numpy as np

from bench.common import experiment, machine, table

# config -> the rows' settings: (rollout.engine, rollout.partial_decode_steps)
WORKLOADS = {
    "countdown_continuous": {"static": ("static", None), "continuous": ("continuous", None),
                             "continuous + partial (16 steps)": ("continuous", 16)},
    "calculator_grpo": {"static": ("static", None), "continuous": ("continuous", None)},
}


def _config(name: str, engine: str, partial: int | None, steps: int):
  config = experiment(name)
  config.rollout.engine, config.rollout.partial_decode_steps = engine, partial
  config.rl.steps, config.rl.eval_every, config.checkpoint.every = steps, 10**6, 10**6
  config.task.eval_size = 100
  return config


def _timed_run(config, workdir: str, warmup: int) -> tuple[float, float, float]:
  """(median seconds between consecutive RL steps' metric writes, generated tokens a step,
  generated tokens a second), over the steps after the first `warmup`."""
  from jaxcredit.train import loop, metrics
  written, tokens = [], []
  write = metrics.MetricsWriter.write

  def timed_write(self, step, record):
    if "train/loss" in record:
      written.append(time.perf_counter())
      tokens.append(record["train/gen_tokens"])
    write(self, step, record)

  metrics.MetricsWriter.write = timed_write
  try:
    loop.run(config, workdir)
  finally:
    metrics.MetricsWriter.write = write
  steps, tokens_after = len(written) - 1 - warmup, tokens[-1] - tokens[warmup]
  return (float(np.median(np.diff(written[warmup:]))), tokens_after / steps,
          tokens_after / (written[-1] - written[warmup]))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--configs", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
  parser.add_argument("--steps", type=int, default=12)
  parser.add_argument("--warmup", type=int, default=4)
  parser.add_argument("--out", default=None, help="also write the table to this file")
  args = parser.parse_args(argv)
  rows = []
  for name in args.configs:
    engines, measured = WORKLOADS[name], {}
    for label, (engine, partial) in engines.items():
      with tempfile.TemporaryDirectory() as workdir:
        measured[label] = _timed_run(_config(name, engine, partial, args.steps), workdir,
                                     args.warmup)
    static_seconds, _, static_speed = measured["static"]
    for label, (seconds, tokens, speed) in measured.items():
      rows.append([name, label, f"{1e3 * seconds:.0f}", f"{tokens:,.0f}", f"{speed:,.0f}",
                   f"{speed / static_speed:.2f}x", f"{static_seconds / seconds:.2f}x"])
  report = "\n".join([
      "# Training with each sampling engine", "", f"machine: {machine()}", "",
      f"RL steps {args.warmup + 1}-{args.steps} of each run (medians; the first "
      f"{args.warmup} compile); the shipped configs' settings otherwise (slots: a quarter of "
      "the step's rows).", "",
      table(["config", "engine", "ms per RL step", "generated tokens a step",
             "generated tok/s", "tok/s vs static", "step time vs static"], rows)])
  print(report)
  if args.out:
    pathlib.Path(args.out).write_text(
        f"# python -m bench.engines --configs {' '.join(args.configs)} --steps {args.steps} "
        f"--warmup {args.warmup}, run "
        f"{time.strftime('%Y-%m-%d')}\n\n{report}\n")


if __name__ == "__main__":
  main()
