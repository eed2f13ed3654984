"""Overlapped sampling and learning vs synchronous RL on 8 CPU devices.

  python -m bench.overlap [--steps 10] [--out bench/results/overlap.md]

Runs the training loop three ways on the same task and seed, in a process with N
forced host devices (`SPLITS`: 8 devices, and 2 single-threaded ones):
  synchronous   every update samples and learns on all N devices, one after the other;
  simulated     N/2 devices sample and learn in turn with the lags of the overlapped
                run (rl.staleness_mode = "periodic"): the same computation, not overlapped;
  overlapped    mesh.shape N/2 + mesh.sampler_shape N/2: batch t + 1 is sampled during
                update t (jaxcredit.train.overlap).
The time of an RL step is the interval between consecutive metric writes (the first
`--warmup` steps, which compile, are left out); median over the rest.
"""

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from bench.common import ROOT, experiment

# name -> (task, task options, prompts per step, group size, seconds the verifier takes
# per batch: a sleep after scoring stands for a sandbox or a reward model on the host)
WORKLOADS = {
    "arithmetic (quickstart)": ("arithmetic", {}, 32, 8, 0.0),
    "key_token, 48 tokens": ("key_token", {"length": 48, "n_keys": 4}, 16, 8, 0.0),
    "arithmetic, 150 ms verifier": ("arithmetic", {}, 32, 8, 0.15),
}


def _config(task: str, options: dict, prompts: int, group: int, steps: int):
  config = experiment("quickstart")
  config.task.name, config.task.options = task, options
  config.task.train_size, config.task.test_size, config.sft.max_steps = 256, 16, 0
  config.rl.prompts_per_step, config.rl.group_size = prompts, group
  config.rl.steps, config.rl.eval_every, config.checkpoint.every = steps, 10**6, 10**6
  return config


def _timed_run(config, workdir: str, warmup: int, verifier_s: float) -> tuple[float, float]:
  """Median seconds between consecutive RL steps' metric writes, and median seconds of
  sampling + scoring a batch, after `warmup` steps."""
  from jaxcredit.rollout_sources import SingleTurn
  from jaxcredit.train import loop, metrics
  written, sampling = [], []
  write, sample = metrics.MetricsWriter.write, SingleTurn.__call__

  def timed_write(self, step, record):
    if "train/loss" in record:
      written.append(time.perf_counter())
    write(self, step, record)

  def timed_sample(self, model, batch, key):
    start = time.perf_counter()
    rollout = jax.block_until_ready(sample(self, model, batch, key))
    if self.temperature > 0:  # not the greedy evaluation
      time.sleep(verifier_s)
      sampling.append(time.perf_counter() - start)
    return rollout

  metrics.MetricsWriter.write, SingleTurn.__call__ = timed_write, timed_sample
  try:
    loop.run(config, workdir)
  finally:
    metrics.MetricsWriter.write, SingleTurn.__call__ = write, sample
  return float(np.median(np.diff(written[warmup:]))), float(np.median(sampling[warmup:]))


# devices -> the extra XLA flags of that machine: 8 devices (4 + 4) share the host's
# cores; 2 single-threaded devices (1 + 1) give each side a core of its own.
SPLITS = {8: "", 2: " --xla_cpu_multi_thread_eigen=false"}


def measure(steps: int, warmup: int, sync_every: int) -> str:
  from bench.common import machine, table
  half = (jax.device_count() // 2, 1, 1, 1)
  rows = []
  for name, (task, options, prompts, group, verifier_s) in WORKLOADS.items():
    arms = {}
    for arm in ("synchronous", "simulated", "overlapped"):
      config = _config(task, options, prompts, group, steps)
      if arm != "synchronous":
        config.mesh.shape = half
      if arm == "simulated":
        config.rl.max_staleness, config.rl.staleness_mode = sync_every, "periodic"
      if arm == "overlapped":
        config.mesh.sampler_shape, config.rl.sync_every = half, sync_every
      with tempfile.TemporaryDirectory() as workdir:
        arms[arm] = _timed_run(config, workdir, warmup, verifier_s)
    step, sampling = arms["simulated"]
    bound = max(sampling, step - sampling)
    for arm, (seconds, sample_seconds) in arms.items():
      rows.append([name, arm, f"{1e3 * seconds:.1f}", f"{1e3 * sample_seconds:.1f}",
                   f"{arms['synchronous'][0] / seconds:.2f}x", f"{step / seconds:.2f}x"])
    rows.append([name, "bound: max(sampling, learning) of simulated", f"{1e3 * bound:.1f}", "",
                 f"{arms['synchronous'][0] / bound:.2f}x", f"{step / bound:.2f}x"])
  return "\n".join([
      f"## {jax.device_count()} devices: learner {half[0]} + sampler {half[0]}", "",
      f"machine: {machine()}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}", "",
      table(["workload", "run", "ms per RL step", "sampling ms", "vs synchronous",
             "vs simulated"], rows), ""])


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--sync-every", type=int, default=1)
  parser.add_argument("--out", default=None, help="also write the tables to this file")
  args, child = parser.parse_known_args()
  if child:  # --devices N: one split, in a process started with its XLA flags
    print(measure(args.steps, args.warmup, args.sync_every))
    return
  reports = []
  for devices, flags in SPLITS.items():
    env = {**os.environ,
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}{flags}"}
    result = subprocess.run(
        [sys.executable, "-m", "bench.overlap", "--steps", str(args.steps), "--warmup",
         str(args.warmup), "--sync-every", str(args.sync_every), "--devices", str(devices)],
        env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    reports.append(result.stdout[result.stdout.index(f"## {devices} devices"):])
  report = "\n".join([
      "# Overlapped sampling and learning", "",
      f"tiny model, float32; sync_every = {args.sync_every}; medians over steps "
      f"{args.warmup + 1}-{args.steps} (the first {args.warmup} compile). sampling: sampling "
      "and scoring one batch (in the overlapped run, during an update). bound: the step of "
      "a perfect overlap on hardware the two sides do not share, max(sampling, step - "
      "sampling) of the simulated run.", "", *reports])
  print(report)
  if args.out:
    pathlib.Path(args.out).write_text(
        f"# python -m bench.overlap, run {time.strftime('%Y-%m-%d')}\n\n{report}")


if __name__ == "__main__":
  main()
