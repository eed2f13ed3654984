"""Sampling throughput: the KV-cache sampler vs re-running the whole prefix,
multi-turn rollouts keeping the cache across turns vs prefilling every turn's
whole context, and drawing a token by inverse CDF vs `jax.random.categorical`.

python -m bench.sampler [--batch 32 --prompt 64 --new 256 --turns 8]

Both samplers generate the same tokens (greedy agreement is tested); the
baseline re-forwards the full [B, P + N] buffer at every step, which is what a
sampler without a cache does. The multi-turn table plays the same episodes
both ways (same key; asserted) against an environment answering each turn
with 32-96 observation tokens, timed in turn (round robin). The draw table
times one token per row from [B, V] logits at temperature 1, the
implementations in turn.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.common import machine, table, time_call, time_calls
from bench.no_cache import RebuildingMultiTurn, generate_without_cache
from jaxcredit.models import Transformer, preset
from jaxcredit.rollout_sources import MultiTurn
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


class ToolEnv:
  """Answers every turn with `low` to `high` observation tokens (a tool's output; 32-96 by
  default) after `low` at reset; done after `turns` turns."""

  def __init__(self, turns: int, vocab: int, low: int = 32, high: int = 96):
    self.turns, self.vocab, self.low, self.high = turns, vocab, low, high

  def reset(self, rng, example):
    del example
    return (0, rng), rng.integers(1, self.vocab, self.low)

  def step(self, state, actions):
    turn, rng = state
    observation = rng.integers(1, self.vocab, int(rng.integers(self.low, self.high + 1)))
    return (turn + 1, rng), observation, float(actions[0] % 2), turn + 1 >= self.turns


def multi_turn_rows(batch: int, prompt: int, turns: int, repeats: int) -> list[list]:
  rows = []
  turn_tokens = 32
  for name in ("tiny", "small"):
    config = preset(name)
    model = Transformer(config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    prompts = {"prompts": rng.integers(1, config.vocab_size, (batch, prompt)),
               "prompt_valid": np.ones((batch, prompt), bool), "examples": [{}] * batch}
    play = {}
    for label, source_type in (("kept", MultiTurn), ("full prefill", RebuildingMultiTurn)):
      source = source_type(ToolEnv(turns, config.vocab_size), max_turns=turns,
                           max_turn_tokens=turn_tokens,
                           max_episode_tokens=turns * (turn_tokens + 96))
      play[label] = lambda key, source=source: source(model, prompts, key).tokens
    kept, full = (np.asarray(fn(jax.random.key(0))) for fn in play.values())
    np.testing.assert_array_equal(kept, full)  # the same episodes
    seconds = time_calls(play, jax.random.key(0), repeats=repeats)
    actions = batch * turns * turn_tokens
    rows.append([name, f"{actions / seconds['kept']:,.0f}",
                 f"{actions / seconds['full prefill']:,.0f}",
                 f"{seconds['full prefill'] / seconds['kept']:.2f}x"])
  return rows


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--new", type=int, default=256)
  parser.add_argument("--turns", type=int, default=8)
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
    for use_cache, sample in ((True, generate), (False, generate_without_cache)):
      run = lambda key, sample=sample: sample(model, prompts, valid, key,
                                              max_new_tokens=args.new).tokens
      seconds = time_call(run, jax.random.key(0), repeats=args.repeats if use_cache else 1)
      results[use_cache] = args.batch * args.new / seconds
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    rows.append([
        f"{name} ({config.n_layers} layers, d={config.d_model}, V={config.vocab_size}, "
        f"{params / 1e6:.2f}M)",
        f"{results[True]:,.0f}", f"{results[False]:,.0f}", f"{results[True] / results[False]:.1f}x",
    ])
  print(table(["model", "KV cache (tok/s)", "recompute prefix (tok/s)", "speedup"], rows))
  print(f"\n## Multi-turn rollouts: {args.turns} turns of 32 action tokens, observations of "
        f"32-96 tokens, batch {args.batch}, prompt {args.prompt} (action tok/s)\n")
  print(table(["model", "cache kept across turns", "whole context prefilled per turn",
               "speedup"], multi_turn_rows(args.batch, args.prompt, args.turns, args.repeats)))
  print("\n## One token per row from [B, V] logits (ms)\n")
  print(table(["[B, V]", "sample_token (inverse CDF)", "jax.random.categorical (Gumbel)",
               "speedup"], draw_rows(repeats=100)))


if __name__ == "__main__":
  main()
