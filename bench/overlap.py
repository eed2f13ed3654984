"""Overlapped sampling and learning vs synchronous RL on 8 CPU devices.

  python -m bench.overlap [--steps 12] [--out bench/results/overlap.md]

Runs the training loop three ways on the same task and seed, in one process with 8
forced host devices (re-launched with XLA_FLAGS when there are fewer):
  synchronous   every update samples and learns on all 8 devices, one after the other;
  simulated     4 devices sample and learn in turn with the lags of the overlapped run
                (rl.staleness_mode = "periodic"): the same computation, not overlapped;
  overlapped    mesh.shape 4 + mesh.sampler_shape 4: batch t + 1 is sampled during
                update t (jaxcredit.train.overlap).
The time of an RL step is the interval between consecutive metric writes (the first
`--warmup` steps, which compile, are left out); median over the rest.
"""

import argparse
import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).parent.parent
WORKLOADS = {  # name -> (task, task options, prompts per step, group size)
    "arithmetic (quickstart)": ("arithmetic", {}, 32, 8),
    "key_token, 48 tokens": ("key_token", {"length": 48, "n_keys": 4}, 16, 8),
}


def _config(task: str, options: dict, prompts: int, group: int, steps: int):
  spec = importlib.util.spec_from_file_location("quickstart", ROOT / "experiments/quickstart.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.task.name, config.task.options = task, options
  config.task.train_size, config.task.test_size, config.sft.max_steps = 256, 16, 0
  config.rl.prompts_per_step, config.rl.group_size = prompts, group
  config.rl.steps, config.rl.eval_every, config.checkpoint.every = steps, 10**6, 10**6
  return config


def _step_seconds(config, workdir: str, warmup: int) -> float:
  """Median seconds between consecutive RL steps' metric writes, after `warmup` steps."""
  from jaxcredit.train import loop, metrics
  written = []
  write = metrics.MetricsWriter.write

  def timed_write(self, step, record):
    if "train/loss" in record:
      written.append(time.perf_counter())
    write(self, step, record)

  metrics.MetricsWriter.write = timed_write
  try:
    loop.run(config, workdir)
  finally:
    metrics.MetricsWriter.write = write
  return float(np.median(np.diff(written[warmup:])))


def measure(steps: int, warmup: int, sync_every: int) -> str:
  import jax
  from bench.common import machine, table
  rows = []
  for name, (task, options, prompts, group) in WORKLOADS.items():
    arms = {}
    for arm in ("synchronous", "simulated", "overlapped"):
      config = _config(task, options, prompts, group, steps)
      if arm != "synchronous":
        config.mesh.shape = (4, 1, 1, 1)
      if arm == "simulated":
        config.rl.max_staleness, config.rl.staleness_mode = sync_every, "periodic"
      if arm == "overlapped":
        config.mesh.sampler_shape, config.rl.sync_every = (4, 1, 1, 1), sync_every
      with tempfile.TemporaryDirectory() as workdir:
        arms[arm] = _step_seconds(config, workdir, warmup)
    rows += [[name, arm, f"{1e3 * s:.1f}", f"{arms['synchronous'] / s:.2f}x"]
             for arm, s in arms.items()]
  return "\n".join([
      "# Overlapped sampling and learning", "",
      f"machine: {machine()}; {jax.device_count()} devices", "",
      f"tiny model, float32; sync_every = {sync_every}; median step time over steps "
      f"{warmup + 1}-{steps} (the first {warmup} compile)", "",
      table(["workload", "run", "ms per RL step", "speed-up vs synchronous"], rows), ""])


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=12)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--sync-every", type=int, default=1)
  parser.add_argument("--out", default=None, help="also write the table to this file")
  args = parser.parse_args()
  if "xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    sys.exit(subprocess.call([sys.executable, "-m", "bench.overlap", *sys.argv[1:]], env=env,
                             cwd=ROOT))
  report = measure(args.steps, args.warmup, args.sync_every)
  print(report)
  if args.out:
    pathlib.Path(args.out).write_text(
        f"# python -m bench.overlap, run {time.strftime('%Y-%m-%d')}\n\n{report}")


if __name__ == "__main__":
  main()
