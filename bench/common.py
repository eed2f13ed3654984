"""Shared benchmark helpers: timing, machine description, markdown tables, shipped configs."""

import importlib.util
import os
import pathlib
import platform
import time

import jax
import numpy as np


ROOT = pathlib.Path(__file__).resolve().parent.parent


def experiment(name: str):
  """get_config() of the shipped config experiments/<name>.py."""
  spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def machine() -> str:
  """One line naming the host and the JAX backend."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  devices = ", ".join(sorted({d.device_kind for d in jax.devices()}))
  return (
      f"{cpu}; {os.cpu_count()} cores; jax {jax.__version__} on "
      f"{jax.default_backend()} ({devices})"
  )


def time_call(fn, *args, repeats: int = 10, warmup: int = 1) -> float:
  """Median wall time of fn(*args) in seconds, after `warmup` calls (compilation)."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def time_calls(fns: dict, *args, repeats: int = 10, warmup: int = 1) -> dict[str, float]:
  """Median wall time in seconds of each fn(*args), the calls taken in turn
  (round robin), so that a slow spell of a shared machine costs every
  implementation alike and the ratios between them stay fair."""
  for fn in fns.values():
    for _ in range(warmup):
      jax.block_until_ready(fn(*args))
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - start)
  return {name: float(np.median(t)) for name, t in times.items()}


def table(header: list[str], rows: list[list]) -> str:
  """A markdown table."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)
