"""Sampling throughput: the KV-cache sampler vs re-running the whole prefix.

python -m bench.sampler [--batch 32 --prompt 64 --new 256]

Both generate the same tokens (greedy agreement is tested); the baseline
re-forwards the full [B, P + N] buffer at every step, which is what a
sampler without a cache does.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.common import machine, table, time_call
from jaxcredit.models import Transformer, preset
from jaxcredit.sampling import generate


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--new", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  print(f"# Sampler benchmark\n\nmachine: {machine()}\n")
  print(f"batch {args.batch}, prompt {args.prompt}, {args.new} new tokens, temperature 1, float32\n")
  rows = []
  for name in ("tiny", "small"):
    config = preset(name)
    model = Transformer(config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(0, config.vocab_size, (args.batch, args.prompt)))
    valid = jnp.ones(prompts.shape, bool)
    results = {}
    for use_cache in (True, False):
      run = lambda key: generate(model, prompts, valid, key, max_new_tokens=args.new, use_cache=use_cache).tokens
      seconds = time_call(run, jax.random.key(0), repeats=args.repeats if use_cache else 1)
      results[use_cache] = args.batch * args.new / seconds
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    rows.append([
        f"{name} ({config.n_layers} layers, d={config.d_model}, V={config.vocab_size}, {params / 1e6:.2f}M)",
        f"{results[True]:,.0f}", f"{results[False]:,.0f}", f"{results[True] / results[False]:.1f}x",
    ])
  print(table(["model", "KV cache (tok/s)", "recompute prefix (tok/s)", "speedup"], rows))


if __name__ == "__main__":
  main()
