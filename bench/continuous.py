"""Generation on long-tailed response lengths: the static sampler against continuous batching,
in one run.

    python -m bench.continuous [--presets tiny small] [--slots 32] [--prompts 32 --group 8]

R = prompts x group responses of a prompt of 64 tokens, their lengths drawn from

  long tail   log-normal with p50 = 64 and p99 = 1,024 tokens, cut at the budget of 1,024
              (sigma = ln 16 / z_0.99), as reasoning responses are;
  equal       every response 128 tokens (the control: nothing for continuous batching to
              recover).

A response's length is its budget (`budgets`), so both engines generate exactly the same
tokens (asserted: the same keys draw the same responses). The engines, at the same number of
rows decoded at once (S slots):

  static       `sampling.generate` on S rows at a time, R / S calls in turn, each running until
               its longest response ends (what a batch of S rows costs when responses stop);
  continuous   `sampling.generate_continuous` with S slots: a slot takes the next response as
               soon as its own ends.

Columns: generated tokens/s (every response's tokens over the wall time), decode steps (of S
rows), useful work (generated tokens / (decode steps x S): the fraction of decoded rows that
were live responses), and the speed-up over static. Times are the median of `--repeats` runs
after a warm-up run (compilation).
"""

import argparse
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.common import machine, table
from jaxcredit.models import Transformer, preset
from jaxcredit.sampling import generate, generate_continuous
from jaxcredit.sampling.continuous import response_keys

PROMPT = 64
Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile


def lengths(kind: str, responses: int, *, p50: int, p99: int, budget: int,
            seed: int = 0) -> np.ndarray:
  """[responses] lengths in [1, budget]: log-normal through p50 and p99, or all equal."""
  if kind == "equal":
    return np.full(responses, min(2 * p50, budget), np.int32)
  rng = np.random.default_rng(seed)
  sigma = math.log(p99 / p50) / Z99
  drawn = np.exp(rng.normal(math.log(p50), sigma, responses))
  return np.clip(np.rint(drawn), 1, budget).astype(np.int32)


def _engines(model, prompts, group, slots, budget, budgets):
  valid = jnp.ones(prompts.shape, bool)
  responses = prompts.shape[0] * group
  keys = response_keys(jax.random.key(0), responses)
  rows, row_valid = jnp.repeat(prompts, group, 0), jnp.repeat(valid, group, 0)

  def static():
    outs = [generate(model, rows[i:i + slots], row_valid[i:i + slots], keys[i:i + slots],
                     max_new_tokens=budget, budgets=budgets[i:i + slots])
            for i in range(0, responses, slots)]
    return (jnp.concatenate([o.tokens for o in outs]),
            sum(int(o.decode_steps) for o in outs))

  def continuous():
    out = generate_continuous(model, prompts, valid, keys, slots=slots, group_size=group,
                              max_new_tokens=budget, budgets=budgets)
    return out.tokens, int(out.decode_steps)

  return {"static": static, "continuous": continuous}


def _timed(fn, repeats: int):
  fn()  # compilation
  times, result = [], None
  for _ in range(repeats):
    started = time.perf_counter()
    result = jax.block_until_ready(fn())
    times.append(time.perf_counter() - started)
  return float(np.median(times)), result


def rows_for(name: str, args) -> list[list]:
  config = preset(name)
  model = Transformer(config, rngs=nnx.Rngs(0))
  prompts = jax.random.randint(jax.random.key(1), (args.prompts, PROMPT), 1, config.vocab_size)
  rows = []
  for kind in ("long tail", "equal"):
    budgets = lengths(kind.split()[0], args.prompts * args.group, p50=args.p50, p99=args.p99,
                      budget=args.budget)
    for slots in args.slots:
      engines = _engines(model, prompts, args.group, slots, args.budget, jnp.asarray(budgets))
      measured = {engine: _timed(fn, args.repeats) for engine, fn in engines.items()}
      np.testing.assert_array_equal(measured["static"][1][0], measured["continuous"][1][0])
      tokens = int(budgets.sum())
      for engine, (seconds, (_, steps)) in measured.items():
        rows.append([name, kind, slots, engine, f"{tokens / seconds:,.0f}", f"{steps:,}",
                     f"{tokens / (steps * slots):.0%}", f"{seconds:.1f}",
                     f"{measured['static'][0] / seconds:.2f}x"])
  return rows


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
  parser.add_argument("--slots", type=int, nargs="+", default=[32])
  parser.add_argument("--prompts", type=int, default=32)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--p50", type=int, default=64)
  parser.add_argument("--p99", type=int, default=1024)
  parser.add_argument("--budget", type=int, default=1024)
  parser.add_argument("--repeats", type=int, default=1)
  args = parser.parse_args(argv)
  drawn = lengths("long", args.prompts * args.group, p50=args.p50, p99=args.p99,
                  budget=args.budget)
  print("# Continuous batching on long-tailed response lengths\n")
  print(f"machine: {machine()}\n")
  print(f"{args.prompts} prompts x {args.group} responses = {args.prompts * args.group}, prompt "
        f"{PROMPT} tokens, budget {args.budget}, temperature 1, float32; the long tail's drawn "
        f"lengths: p50 {np.percentile(drawn, 50):.0f}, p90 {np.percentile(drawn, 90):.0f}, "
        f"p99 {np.percentile(drawn, 99):.0f}, max {drawn.max()}, mean {drawn.mean():.0f}; "
        f"equal: every response {min(2 * args.p50, args.budget)} tokens. Median of "
        f"{args.repeats} run(s) after a warm-up.\n")
  rows = [row for name in args.presets for row in rows_for(name, args)]
  print(table(["model", "lengths", "slots", "engine", "generated tok/s", "decode steps",
               "useful work", "seconds", "vs static"], rows))


if __name__ == "__main__":
  main()
