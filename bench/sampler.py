"""Sampling throughput: the KV-cache sampler vs re-running the whole prefix, and
drawing a token by inverse CDF vs `jax.random.categorical`.

python -m bench.sampler [--batch 32 --prompt 64 --new 256]

Both samplers generate the same tokens (greedy agreement is tested); the
baseline re-forwards the full [B, P + N] buffer at every step, which is what a
sampler without a cache does. The draw table times one token per row from
[B, V] logits at temperature 1, the implementations in turn (round robin).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.common import machine, table, time_call, time_calls
from jaxcredit.models import Transformer, preset
from jaxcredit.sampling import generate, sample_token

DRAW_SHAPES = [(32, 8192), (8, 151936)]  # [B, V]: the small peers shape; Qwen2.5's vocabulary


def draw_rows(repeats: int) -> list[list]:
  rows = []
  for batch, vocab in DRAW_SHAPES:
    logits = jax.random.normal(jax.random.key(0), (batch, vocab))
    key = jax.random.key(1)
    ours = jax.jit(lambda z, k: sample_token(z, k, temperature=1.0, top_k=None, top_p=None))
    gumbel = jax.jit(lambda z, k: jax.random.categorical(k, z, axis=-1))
    times = time_calls({"ours": ours, "categorical": gumbel}, logits, key, repeats=repeats)
    ours_ms, gumbel_ms = 1e3 * times["ours"], 1e3 * times["categorical"]
    rows.append([f"[{batch}, {vocab}]", f"{ours_ms:.3f}", f"{gumbel_ms:.3f}",
                 f"{gumbel_ms / ours_ms:.1f}x"])
  return rows


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--new", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  print(f"# Sampler benchmark\n\nmachine: {machine()}\n")
  print(f"batch {args.batch}, prompt {args.prompt}, {args.new} new tokens, temperature 1, "
        "float32\n")
  rows = []
  for name in ("tiny", "small"):
    config = preset(name)
    model = Transformer(config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(0, config.vocab_size, (args.batch, args.prompt)))
    valid = jnp.ones(prompts.shape, bool)
    results = {}
    for use_cache in (True, False):
      run = lambda key: generate(model, prompts, valid, key, max_new_tokens=args.new,
                                 use_cache=use_cache).tokens
      seconds = time_call(run, jax.random.key(0), repeats=args.repeats if use_cache else 1)
      results[use_cache] = args.batch * args.new / seconds
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    rows.append([
        f"{name} ({config.n_layers} layers, d={config.d_model}, V={config.vocab_size}, "
        f"{params / 1e6:.2f}M)",
        f"{results[True]:,.0f}", f"{results[False]:,.0f}", f"{results[True] / results[False]:.1f}x",
    ])
  print(table(["model", "KV cache (tok/s)", "recompute prefix (tok/s)", "speedup"], rows))
  print("\n## One token per row from [B, V] logits (ms)\n")
  print(table(["[B, V]", "sample_token (inverse CDF)", "jax.random.categorical (Gumbel)",
               "speedup"], draw_rows(repeats=100)))


if __name__ == "__main__":
  main()
