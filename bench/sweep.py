"""The credit sweep's programs (`jaxcredit.lab.batched`): compiled memory against the number of
runs per program, and tokens/s of one process on every core against one pinned process per
core side by side (the sweep's `workers`).

python -m bench.sweep [--widths 20 40 70] [--group-sizes 8 32] [--updates 24]

Memory: XLA compiles the program of a small-preset cell (`studies/credit_study/configs.py:small`,
uniform filler, its gradient measurements included) for `width` runs and reports its
temporaries (`memory_analysis()`; nothing is run). Throughput: a cell of `--updates`
updates at G = 8 and the small preset's program width, run once to compile and then timed:
in this process on every core, and in `len(cores)` processes pinned to one core each,
started together (their tokens added up over the slowest one's time).
"""

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import jax

from bench.common import machine, table
from jaxcredit.lab import batched, cells
from studies.credit_study import configs, sweep

GiB = 2**30
ROOT = pathlib.Path(__file__).resolve().parents[1]


def small_study():
  return configs.get_config("small")


def _runs(study, width: int) -> list:
  return [(i % len(study.arms), 1e-3, i) for i in range(width)]


def temp_gib(study, group_size: int, width: int) -> float:
  runner = batched.Runner(sweep.cell_of(study, "uniform_filler", group_size))
  arguments = [jax.ShapeDtypeStruct((width,), dtype) for dtype in ("int32", "float32", "int32")]
  compiled = runner._program.lower(*arguments).compile()
  return compiled.memory_analysis().temp_size_in_bytes / GiB


def short_cell(study, updates: int) -> cells.Cell:
  cell = sweep.cell_of(study, "uniform_filler", 8)
  return dataclasses.replace(cell, updates=updates, eval_every=updates // 4,
                             mechanism_evals=(0, 4))


def timed_short_cell(study, updates: int, before=lambda: None) -> tuple[int, float]:
  """(generated tokens, seconds) of the short cell at the preset's width: compiled and run
  once, then `before()`, then timed."""
  cell, width = short_cell(study, updates), study.runs_per_program
  runner = batched.Runner(cell)
  runner.train(_runs(study, width), width)
  before()
  started = time.perf_counter()
  runner.train(_runs(study, width), width)
  return width * cell.updates * cell.tokens_per_update, time.perf_counter() - started


def pinned_workers(updates: int, cores: list[int]) -> float:
  """Tokens/s over one process per core, their timed runs started together (each waits for
  every other to finish compiling) and divided by the slowest one's time."""
  with tempfile.TemporaryDirectory() as barrier:
    processes = [subprocess.Popen(
        [sys.executable, "-m", "bench.sweep", "--worker", str(core), "--updates", str(updates),
         "--barrier", barrier, "--workers", str(len(cores))],
        cwd=ROOT, stdout=subprocess.PIPE, text=True) for core in cores]
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in processes]
  return sum(r["tokens"] for r in results) / max(r["seconds"] for r in results)


def worker(core: int, updates: int, barrier: str, workers: int) -> None:
  """One pinned process: compile, wait for the others, time the short cell; prints
  {"tokens", "seconds"}."""
  os.sched_setaffinity(0, {core})

  def wait_for_the_others():
    (pathlib.Path(barrier) / f"ready{core}").touch()
    while len(list(pathlib.Path(barrier).glob("ready*"))) < workers:
      time.sleep(0.05)

  tokens, seconds = timed_short_cell(small_study(), updates, wait_for_the_others)
  print(json.dumps({"tokens": tokens, "seconds": seconds}), flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--widths", type=int, nargs="+", default=[20, 40, 70])
  parser.add_argument("--group-sizes", type=int, nargs="+", default=[8, 32])
  parser.add_argument("--updates", type=int, default=24)
  parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
  parser.add_argument("--barrier", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--workers", type=int, default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker is not None:
    worker(args.worker, args.updates, args.barrier, args.workers)
    return
  study = small_study()
  print(f"# The credit sweep's programs\n\nMachine: {machine()}\n")
  print("## XLA temporaries of a small-preset cell's program (compiled, not run)\n")
  rows = [[f"G = {g}"] + [f"{temp_gib(study, g, w):.2f} GiB" for w in args.widths]
          for g in args.group_sizes]
  print(table(["cell"] + [f"{w} runs per program" for w in args.widths], rows))
  cores = sorted(os.sched_getaffinity(0))
  tokens, seconds = timed_short_cell(study, args.updates)
  one = tokens / seconds
  side_by_side = pinned_workers(args.updates, cores)
  print(f"\n## Generated tokens/s, G = 8, {study.runs_per_program} runs per program, "
        f"{args.updates} updates\n")
  print(table(["how", "tokens/s", "vs one process"], [
      [f"one process on {len(cores)} cores (baseline)", f"{one:,.0f}", "1.00×"],
      [f"{len(cores)} processes, one core each (workers = {len(cores)})",
       f"{side_by_side:,.0f}", f"{side_by_side / one:.2f}×"]]))


if __name__ == "__main__":
  main()
