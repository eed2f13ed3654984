"""Multi-turn sampling across hundreds of turns: the cost per turn and per action token as the
number of turns grows, for the KV cache kept across turns (with its headroom, and without
one) against prefilling every turn's whole context.

python -m bench.turns [--batch 8 --turn-tokens 4 --turns 8 64 256 512 --full-prefill-turns 64]

An environment answers each turn with 4-12 observation tokens, after 4 at reset (so the rows'
blocks leave pad slots). The three sources play the same episodes from the same key
(asserted); each is timed on its own after a warm-up run (compilation). A cost per turn that
stays flat as the turns grow, beyond attention's own growth with the context, is the target;
prefilling the whole context every turn grows with it, so its total work is quadratic in
turns. The named baseline for attention's own cost: decoding alone (no turns) after a prompt
as long as the episode's mean context; a ratio to it that does not grow with the turns is a
cost per action token that grows no faster than attention's own.
"""

import argparse
import time

import jax
import numpy as np
from flax import nnx

from bench.common import machine, table, time_call
from bench.no_cache import RebuildingMultiTurn
from bench.sampler import ToolEnv
from jaxcredit import sampling
from jaxcredit.models import Transformer, preset
from jaxcredit.rollout_sources import MultiTurn, turn_sampler


def _counting_rebuilds(play):
  """play() and the number of times it built a cache (`start_contexts`)."""
  calls = []
  original = turn_sampler.start_contexts

  def counted(*args, **kwargs):
    calls.append(1)
    return original(*args, **kwargs)

  turn_sampler.start_contexts = counted
  try:
    out = play()
  finally:
    turn_sampler.start_contexts = original
  return out, len(calls)


def rows_for(turns: int, batch: int, turn_tokens: int, full_prefill_turns: int) -> list[list]:
  config = preset("tiny")
  model = Transformer(config, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  prompts = {"prompts": rng.integers(1, config.vocab_size, (batch, 16)),
             "prompt_valid": np.ones((batch, 16), bool), "examples": [{}] * batch}

  def make(source_type, **options):
    return source_type(ToolEnv(turns, config.vocab_size, 4, 12), max_turns=turns,
                       max_turn_tokens=turn_tokens,
                       max_episode_tokens=4 + turns * (turn_tokens + 12), **options)

  sources = {"kept": make(MultiTurn)}
  if turns <= full_prefill_turns:  # the baselines rebuild the cache (almost) every turn
    sources["kept, no headroom"] = make(MultiTurn, cache_headroom=0)
    sources["whole context every turn"] = make(RebuildingMultiTurn)
  tokens = {}
  rows = []
  for label, source in sources.items():
    play = lambda source=source: source(model, prompts, jax.random.key(0))
    rollout, rebuilds = _counting_rebuilds(play)
    tokens[label] = np.asarray(rollout.tokens)
    seconds = time_call(lambda: play().tokens, repeats=1)
    actions = int(np.asarray(rollout.mask).sum())
    rows.append([turns, label, f"{actions / seconds:,.0f}", f"{1e3 * seconds / turns:.1f}",
                 f"{1e6 * seconds / actions:.0f}", rebuilds,
                 int(np.asarray(rollout.token_valid).sum(1).max())])
  first = next(iter(tokens.values()))
  assert all(np.array_equal(first, t) for t in tokens.values()), "the sources' episodes differ"
  context = int(np.asarray(rollout.token_valid).sum(1).max()) // 2
  per_token = decode_alone(model, batch, context)
  for row in rows:  # µs per action token, as a multiple of decoding alone
    row.insert(5, f"{float(row[4]) / (1e6 * per_token):.1f}×")
  rows.append([turns, f"decode alone at {context} tokens of context", "", "",
               f"{1e6 * per_token:.0f}", "1×", "", ""])
  return rows


def decode_alone(model, batch: int, context: int, steps: int = 32) -> float:
  """Seconds per sampled token (a row's) of `steps` decode steps after a `context`-token
  prompt, in a cache of context + steps slots: the decoder's own cost at the episode's mean
  context, without the turns (no observations, no host round trips)."""
  rng = np.random.default_rng(1)
  tokens = rng.integers(1, model.config.vocab_size, (batch, context))
  valid = np.ones((batch, context), bool)

  def decode():
    contexts = sampling.start_contexts(model, tokens, valid, slots=context + steps)
    jax.block_until_ready(contexts)
    start = time.perf_counter()
    continuation, _ = sampling.continue_contexts(model, contexts, jax.random.key(0),
                                                 max_new_tokens=steps, done=np.zeros(batch, bool))
    jax.block_until_ready(continuation.tokens)
    return time.perf_counter() - start

  decode()  # compilation
  return min(decode() for _ in range(3)) / (steps * batch)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--turn-tokens", type=int, default=4)
  parser.add_argument("--turns", type=int, nargs="+", default=[8, 64, 256, 512])
  parser.add_argument("--full-prefill-turns", type=int, default=64,
                      help="the most turns the baselines are run at")
  args = parser.parse_args()
  print(f"# Multi-turn sampling across turns\n\nmachine: {machine()}\n")
  print(f"tiny preset, batch {args.batch}, prompt 16, {args.turn_tokens} action tokens a turn, "
        "observations of 4-12 tokens, temperature 1, float32\n")
  header = ["turns", "source", "action tok/s", "ms / turn", "µs / action token",
            "vs decode alone", "cache builds", "longest row (tokens)"]
  print(table(header, []))
  for turns in args.turns:
    rows = rows_for(turns, args.batch, args.turn_tokens, args.full_prefill_turns)
    print(table(header, rows).split("\n", 2)[2], flush=True)


if __name__ == "__main__":
  main()
