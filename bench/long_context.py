"""Sampling 100k-token tool episodes: log_lookup with `log_lookup.LONG` (48 pages of 2,112
characters returned by the tool), the policy kept from answering so that every episode reads
the whole log, through the KV cache kept across turns.

python -m bench.long_context [--batch 2 --pages 48]

Reports the tokens an episode holds, the time to sample it (its first turn compiles), the
tokens per second (the tool's pages are prefilled, the turns decoded), the time per turn early
(turns 2-4) and at the end of the episode, and the cache builds. The named baseline is the
same episodes cut to 6 pages (12,700 tokens). A turn costs more late in the episode by
attention's own cost: its page attends to the whole context before it.
"""

import argparse
import dataclasses
import time

import jax
import numpy as np
from flax import nnx

from bench.common import machine, table
from bench.turns import _counting_rebuilds
from jaxcredit.models import Transformer, preset
from jaxcredit.rollout_sources import MultiTurn
from jaxcredit.sampling import Actions
from jaxcredit.tasks import CharTokenizer, log_lookup


def _source(config: log_lookup.LogLookupConfig, tokenizer: CharTokenizer) -> MultiTurn:
  allowed = np.ones(tokenizer.vocab_size, bool)
  allowed[tokenizer.encode("A")] = False  # never answers: every episode reads the whole log
  return MultiTurn(log_lookup.LogLookupEnv(config, tokenizer), max_turns=config.max_turns,
                   max_turn_tokens=config.max_turn_tokens,
                   max_episode_tokens=config.episode_length,
                   turn_end_tokens=tuple(tokenizer.encode(log_lookup.TURN_END)),
                   actions=Actions(allowed=allowed))


class _Timed:
  """An environment that notes the host's clock at each step (each turn's end, per row)."""

  def __init__(self, env):
    self.env, self.times = env, []

  def reset(self, rng, example):
    return self.env.reset(rng, example)

  def step(self, state, actions):
    self.times.append(time.perf_counter())
    return self.env.step(state, actions)

  def anchor(self, state):
    return self.env.anchor(state)


def row(pages: int, batch: int) -> list:
  config = dataclasses.replace(log_lookup.LONG, n_pages=pages)
  tokenizer = CharTokenizer(log_lookup.ALPHABET)
  model = Transformer(preset("tiny", vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  examples = [log_lookup.make_example(rng, config) for _ in range(batch)]
  prompts = np.stack([tokenizer.encode(e["prompt"]) for e in examples])
  batch_input = {"prompts": prompts, "prompt_valid": np.ones(prompts.shape, bool),
                 "examples": examples}
  timed = _Timed(log_lookup.LogLookupEnv(config, tokenizer))
  source = dataclasses.replace(_source(config, tokenizer), env=timed)
  start = time.perf_counter()
  rollout, builds = _counting_rebuilds(lambda: source(model, batch_input, jax.random.key(0)))
  jax.block_until_ready(rollout.tokens)
  seconds = time.perf_counter() - start
  tokens = int(np.asarray(rollout.token_valid).sum(1).max())
  # Per turn: the clock between the last rows' env steps of consecutive turns; the first turn
  # compiles (prefill, page block, decode) and is left out.
  ends = np.asarray(timed.times[batch - 1::batch])
  per_turn = np.diff(ends) * 1e3
  early, late = per_turn[:3].mean(), per_turn[-3:].mean()
  return [pages, batch, f"{tokens:,}", f"{seconds:.1f}", f"{batch * tokens / seconds:,.0f}",
          f"{early:.0f}", f"{late:.0f}", builds]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--pages", type=int, nargs="+", default=[6, 48])
  args = parser.parse_args()
  print(f"# Sampling 100k-token tool episodes\n\nmachine: {machine()}\n")
  print("tiny preset, log_lookup (2,112-character pages, 4-character turns), the answer "
        "forbidden so every episode reads the whole log, temperature 1, float32\n")
  header = ["pages", "rows", "tokens / episode", "seconds (with compilation)", "tokens/s",
            "ms / turn (turns 2-4)", "ms / turn (last 3)", "cache builds"]
  print(table(header, []))
  for pages in args.pages:
    print(table(header, [row(pages, args.batch)]).split("\n", 2)[2], flush=True)


if __name__ == "__main__":
  main()
