"""Multi-turn episodes of long-tailed lengths: every row played at once against episode slots
(continuous batching of episodes, `MultiTurn.slots`), in one run.

    python -m bench.episodes [--presets tiny small] [--episodes 64] [--slots 16]

B episodes, each of a prompt of 16 tokens and a reset observation of 4; a turn is exactly
`--turn-tokens` action tokens (no turn-end token), answered by 4 observation tokens. Episode r
runs T_r turns, drawn log-normal through p50 = 4 and p99 = 64 turns (cut at `--max-turns`), as
an agent's episodes are: most end in a few turns, a few run to the limit. The environment ends
an episode after its T_r turns whatever the actions, so every engine draws exactly the same
number of action tokens (asserted). The engines:

  every row at once    `MultiTurn` on the B rows: each turn decodes every row until the longest
                       episode ends (finished rows sit in their slots);
  S rows at a time     `MultiTurn` on S rows, B / S calls in turn, each until its longest
                       episode ends (a static batch of S rows, as the single-turn bench's);
  episode slots        `MultiTurn(slots=S)`: a row whose episode ends takes the next episode.

Columns: action tokens/s (action tokens over the wall time), the turns sampled (one decode of
every row of the batch, `MultiTurn`'s unit of work), live rows a turn (episode turns played
over turns sampled), the action tokens, seconds, and the speed-up over every row at once.
Times are the median of `--repeats` runs after a warm-up run (compilation).
"""

import argparse
import math
import time

import jax
import numpy as np
from flax import nnx

from bench.common import machine, table
from jaxcredit.models import Transformer, preset
from jaxcredit.rollout_sources import MultiTurn

PROMPT, OBSERVATION = 16, 4
Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile


class LengthEnv:
  """Ends episode `example["turns"]` turns after its reset, whatever the actions; observations
  of OBSERVATION tokens; reward 1 for an even first action."""

  def __init__(self, vocab: int):
    self.vocab = vocab

  def reset(self, rng, example):
    return (0, example["turns"]), rng.integers(1, self.vocab, OBSERVATION)

  def step(self, state, actions):
    turn, turns = state
    observation = np.full(OBSERVATION, 1 + turn % (self.vocab - 1))
    return (turn + 1, turns), observation, float(actions[0] % 2 == 0), turn + 1 >= turns


def episode_turns(episodes: int, *, p50: int, p99: int, most: int, seed: int = 0) -> np.ndarray:
  """[episodes] turn counts in [1, most], log-normal through p50 and p99."""
  rng = np.random.default_rng(seed)
  drawn = np.exp(rng.normal(math.log(p50), math.log(p99 / p50) / Z99, episodes))
  return np.clip(np.rint(drawn), 1, most).astype(int)


def _counted(source: MultiTurn):
  """source's __call__ and a list its turns sampled (rows decoded together) are appended to."""
  turns = []
  original = source.turn_sampler.sample

  def counting(model, prompts, *args, **kwargs):
    turns.append(len(prompts))
    return original(model, prompts, *args, **kwargs)

  object.__setattr__(source.turn_sampler, "sample", counting)
  return source, turns


def rows_for(name: str, args) -> list[list]:
  config = preset(name)
  model = Transformer(config, rngs=nnx.Rngs(0))
  turns = episode_turns(args.episodes, p50=args.p50, p99=args.p99, most=args.max_turns)
  rng = np.random.default_rng(1)
  batch = {"prompts": rng.integers(1, config.vocab_size, (args.episodes, PROMPT)),
           "prompt_valid": np.ones((args.episodes, PROMPT), bool),
           "examples": [{"turns": int(t)} for t in turns]}
  columns = OBSERVATION + args.max_turns * (args.turn_tokens + OBSERVATION)
  settings = dict(max_turns=args.max_turns, max_turn_tokens=args.turn_tokens,
                  max_episode_tokens=columns)
  rows, measured = [], {}
  for slots in args.slots:
    engines = {"every row at once": (MultiTurn(LengthEnv(config.vocab_size), **settings), None),
               f"{slots} rows at a time": (MultiTurn(LengthEnv(config.vocab_size), **settings),
                                           slots),
               f"episode slots ({slots})": (MultiTurn(LengthEnv(config.vocab_size), slots=slots,
                                                      **settings), None)}
    for engine, (source, chunk) in engines.items():
      if engine in measured:
        continue
      source, sampled = _counted(source)
      chunk = chunk or args.episodes

      def play(source=source, chunk=chunk):
        return [source(model, {k: v[i:i + chunk] for k, v in batch.items()}, jax.random.key(i))
                for i in range(0, args.episodes, chunk)]

      play()  # compilation
      times = []
      for _ in range(args.repeats):
        sampled.clear()
        started = time.perf_counter()
        rollouts = jax.block_until_ready(play())
        times.append(time.perf_counter() - started)
      actions = sum(int(np.asarray(r.mask).sum()) for r in rollouts)
      assert actions == int(turns.sum()) * args.turn_tokens, (engine, actions)
      measured[engine] = (float(np.median(times)), sampled, actions)
  base = measured["every row at once"][2] / measured["every row at once"][0]
  for engine, (seconds, sampled, actions) in measured.items():
    speed = actions / seconds
    rows.append([name, engine, f"{speed:,.0f}", f"{len(sampled):,}",
                 f"{turns.sum() / len(sampled):.1f}", f"{actions:,}", f"{seconds:.1f}",
                 f"{speed / base:.2f}x"])
  return rows


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
  parser.add_argument("--episodes", type=int, default=64)
  parser.add_argument("--slots", type=int, nargs="+", default=[16])
  parser.add_argument("--turn-tokens", type=int, default=8)
  parser.add_argument("--max-turns", type=int, default=64)
  parser.add_argument("--p50", type=int, default=4)
  parser.add_argument("--p99", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=1)
  args = parser.parse_args(argv)
  turns = episode_turns(args.episodes, p50=args.p50, p99=args.p99, most=args.max_turns)
  print("# Multi-turn episodes of long-tailed lengths\n")
  print(f"machine: {machine()}\n")
  print(f"{args.episodes} episodes, prompt {PROMPT} tokens, {args.turn_tokens} action tokens a "
        f"turn, observations of {OBSERVATION}, temperature 1, float32; turns per episode: p50 "
        f"{np.percentile(turns, 50):.0f}, p90 {np.percentile(turns, 90):.0f}, max {turns.max()}, "
        f"mean {turns.mean():.1f} (limit {args.max_turns}). Median of {args.repeats} run(s) "
        "after a warm-up.\n")
  rows = [row for name in args.presets for row in rows_for(name, args)]
  print(table(["model", "engine", "action tok/s", "turns sampled", "live rows a turn",
               "action tokens", "seconds", "vs every row at once"], rows))


if __name__ == "__main__":
  main()
