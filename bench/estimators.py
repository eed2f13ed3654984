"""GAE speed: every jaxcredit path vs rlax, a tunix-style scan and a per-step loop.

python -m bench.estimators [--repeats N]

The jitted implementations are timed in turn (round robin) in the same run.

Inputs are [B, T] float32 rewards and values with ragged response masks
(prompt prefix, random response end, 10% interior holes). jaxcredit skips
masked positions exactly; the baselines treat the mask as episode
discounts (rlax) or multiply it in (tunix-style, per-step loop), so on masks
with holes they compute a (slightly) different quantity - timings compare
the same amount of work. rlax is optional (`pip install rlax`); torch is
optional (`pip install torch==2.13.0`), NumPy stands in when absent.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from bench.common import machine, table, time_call, time_calls
from jaxcredit import estimators

GAMMA, LAM = 1.0, 0.95
SHAPES = [(64, 1024), (64, 8192), (64, 32768), (8, 32768)]


def make_inputs(batch: int, length: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  starts = rng.integers(0, length // 8, batch)
  ends = rng.integers(length // 2, length + 1, batch)
  positions = np.arange(length)[None]
  holes = rng.random((batch, length)) < 0.1
  mask = (positions >= starts[:, None]) & (positions < ends[:, None]) & ~holes
  rewards = rng.normal(size=(batch, length)).astype(np.float32)
  values = rng.normal(size=(batch, length)).astype(np.float32)
  return rewards, values, mask


def jaxcredit_gae(method):
  return jax.jit(lambda r, v, m: estimators.gae(r, v, m, gamma=GAMMA, lam=LAM, method=method))


def rlax_gae():
  import rlax  # optional baseline

  per_row = jax.vmap(
      lambda r, d, v: rlax.truncated_generalized_advantage_estimation(r, d, LAM, v)
  )

  def fn(r, v, m):
    discounts = GAMMA * m.astype(jnp.float32)
    values = jnp.concatenate([v, jnp.zeros((v.shape[0], 1), v.dtype)], axis=1)
    return per_row(r, discounts, values)

  return jax.jit(fn)


def tunix_style_gae():
  """Batch-major arrays, mask multiplied in, reverse lax.scan over time indices."""

  def fn(r, v, m):
    m = m.astype(jnp.float32)
    r, v = r * m, v * m
    next_v = jnp.pad(v[:, 1:], [(0, 0), (0, 1)])
    deltas = r + GAMMA * next_v - v

    def step(last, t):
      adv = deltas[:, t] + GAMMA * LAM * last * m[:, t]
      return adv, adv

    _, adv = jax.lax.scan(step, jnp.zeros(r.shape[0]), jnp.arange(r.shape[1]), reverse=True)
    return adv.T * m

  return jax.jit(fn)


def per_step_loop():
  """verl/TRL style: a Python loop over t with vector ops on [B] (torch, or NumPy)."""
  try:
    import torch

    backend, to = "torch", torch.from_numpy
    stack = lambda xs: torch.stack(xs, dim=1)
  except ImportError:
    backend, to, stack = "numpy", np.asarray, lambda xs: np.stack(xs, axis=1)

  def fn(r, v, m):
    r, v, m = to(r), to(v), to(m.astype(np.float32))
    last, out = 0.0, []
    for t in reversed(range(r.shape[1])):
      next_v = v[:, t + 1] if t + 1 < r.shape[1] else 0.0
      delta = r[:, t] + GAMMA * next_v - v[:, t]
      last = delta + GAMMA * LAM * last
      out.append(last)
    return stack(out[::-1]) * m

  return fn, f"per-step loop ({backend})"


def bandwidth_floor():
  """One fused pass that reads rewards, values, mask and writes two [B, T] outputs."""
  return jax.jit(lambda r, v, m: (jnp.where(m, r + v, 0.0), jnp.where(m, r - v, 0.0)))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=10)
  args = parser.parse_args()
  print(f"# GAE benchmark\n\nmachine: {machine()}\n")
  loop_fn, loop_name = per_step_loop()
  try:
    rlax_fn = rlax_gae()
  except ImportError:
    rlax_fn = None
    print("rlax not installed: its column is empty (pip install rlax).\n")
  default = estimators.recurrence.default_method()
  rows = []
  for batch, length in SHAPES:
    r, v, m = (jnp.asarray(x) for x in make_inputs(batch, length))
    jitted = {f"jaxcredit {meth}": jaxcredit_gae(meth) for meth in estimators.RECURRENCE_METHODS}
    if rlax_fn is not None:
      jitted["rlax vmapped"] = rlax_fn
    jitted["tunix-style scan"] = tunix_style_gae()
    jitted["floor"] = bandwidth_floor()
    times = time_calls(jitted, r, v, m, repeats=args.repeats)
    floor = times.pop("floor")
    np_inputs = [np.array(x) for x in (r, v, m)]  # writable copies, as torch.from_numpy wants
    times[loop_name] = time_call(loop_fn, *np_inputs, repeats=1, warmup=0)
    ours = times[f"jaxcredit {default}"]
    row = [f"[{batch}, {length}]"] + [f"{t * 1e3:.2f}" for t in times.values()]
    row += [f"{floor * 1e3:.2f}", f"{floor / ours:.0%}"]
    if rlax_fn is not None:
      row.append(f"{times['rlax vmapped'] / ours:.2f}x")
    row.append(f"{times[loop_name] / ours:.0f}x")
    rows.append(row)
  header = ["shape"] + [f"{k} (ms)" for k in times] + ["bandwidth floor (ms)", "floor / default"]
  if rlax_fn is not None:
    header.append("rlax / default")
  header.append("loop / default")
  print(f"default method on {jax.default_backend()}: {default}\n")
  print(table(header, rows))


if __name__ == "__main__":
  main()
