"""Generation on long-tailed response lengths: the static sampler against continuous batching,
in one run, with google-tunix's static sampler as the peer.

    python -m bench.continuous [--presets tiny small] [--slots 32] [--prompts 32 --group 8]
    .venv-bench/bin/python -m bench.continuous  # with tunix (bench.peers says how to set up)

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
               soon as its own ends;
  continuous + partial (xK)
               `continuous.generate_partial` as partial-rollout training calls it, K calls:
               each admits a batch of new responses (the same prompts and lengths, fresh keys)
               after the unfinished ones carried from the last call (`carry_over(pad=True)`),
               and stops after the decode steps a batch needs at full occupancy (its tokens /
               S); a response may so run across calls. It counts the tokens drawn in the K
               calls (the last call's unfinished responses are left there, as in training);
  tunix        google-tunix's `generate.Sampler` (where installed) on S rows at a time, each
               call running until the longest response of its rows ends
               (`max_generation_steps`): a static batch's work, on the same weights (the
               preset in Qwen2's layout, with qkv bias, read by tunix's Qwen2 loader). Its
               tokens are its own draws (another random stream), of the same count.

Columns: generated tokens/s (tokens drawn over the wall time), decode steps, live rows a step
(generated tokens / decode steps, of the S rows a static step decodes; continuous batching's
drain decodes fewer rows a step once a quarter of its slots or fewer are busy), the tokens
drawn, and the speed-up over static in tokens/s. Times are the median
of `--repeats` runs after a warm-up run (compilation: of responses of 1 token for the static
and continuous engines, whose programs do not depend on the lengths; the whole run for the
partial engine, whose calls are the same each run, so that it compiles every carried width
they meet, and for tunix).
"""

import argparse
import math
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench import peers
from bench.common import machine, table
from jaxcredit.models import Transformer, preset
from jaxcredit.sampling import generate, generate_continuous
from jaxcredit.sampling.continuous import generate_partial, response_keys
from jaxcredit.sampling.partial_responses import carry_over

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


def _engines(model, prompts, group, slots, budget, budgets, partial_calls):
  """Each engine: a function returning (tokens or None, decode steps, tokens generated)."""
  valid = jnp.ones(prompts.shape, bool)
  responses = prompts.shape[0] * group
  keys = response_keys(jax.random.key(0), responses)
  rows, row_valid = jnp.repeat(prompts, group, 0), jnp.repeat(valid, group, 0)

  def static():
    outs = [generate(model, rows[i:i + slots], row_valid[i:i + slots], keys[i:i + slots],
                     max_new_tokens=budget, budgets=budgets[i:i + slots])
            for i in range(0, responses, slots)]
    return (jnp.concatenate([o.tokens for o in outs]), sum(int(o.decode_steps) for o in outs),
            sum(int(o.mask.sum()) for o in outs))

  def continuous():
    out = generate_continuous(model, prompts, valid, keys, slots=slots, group_size=group,
                              max_new_tokens=budget, budgets=budgets)
    return out.tokens, int(out.decode_steps), int(out.mask.sum())

  # Partial rollouts as training runs them: every call admits a batch of new responses (the
  # same prompts and budgets, fresh keys) after the carried ones, and decodes at most the
  # steps a batch needs at full occupancy.
  decode_limit = -(-int(np.sum(budgets)) // slots)

  def partial():
    carried, real, steps, generated = None, 0, 0, 0
    for call in range(partial_calls):
      sample = generate_partial(
          model, prompts, valid, response_keys(jax.random.key(call), responses),
          decode_limit=decode_limit, resume=carried, version=call, slots=slots,
          group_size=group, max_new_tokens=budget, budgets=budgets)
      copies = 0 if carried is None else carried.tokens.shape[0] - real
      owned = np.r_[np.ones(real, bool), np.zeros(copies, bool), np.ones(responses, bool)]
      drawn = np.asarray(sample.output.mask) & (np.asarray(sample.version) == call)
      steps += int(sample.output.decode_steps)
      generated += int(drawn[owned].sum())
      unfinished = np.asarray(sample.unfinished) & owned
      real = int(unfinished.sum())
      carried = carry_over(sample._replace(unfinished=unfinished), pad=True) if real else None
    return None, steps, generated

  return {"static": static, "continuous": continuous,
          f"continuous + partial (x{partial_calls})": partial}


def _tunix_engine(theirs, config, prompts, group, slots, budget, budgets):
  """tunix's sampler on `slots` rows at a time, each call as long as its longest response."""
  cache = peers.tunix_sampler.CacheConfig(
      cache_size=PROMPT + budget, num_layers=config.n_layers, num_kv_heads=config.n_kv_heads,
      head_dim=config.resolved_head_dim)
  sampler = peers.tunix_sampler.Sampler(theirs, peers.IdTokenizer(eos=config.vocab_size), cache)
  rows = np.repeat(np.asarray(prompts), group, 0)
  strings = [" ".join(map(str, row)) for row in rows]
  budgets = np.asarray(budgets)

  def tunix():
    steps = 0
    for i in range(0, len(strings), slots):
      longest = int(budgets[i:i + slots].max())
      sampler(strings[i:i + slots], max_generation_steps=longest, max_prompt_length=PROMPT,
              temperature=1.0, top_p=1.0, return_logprobs=True, seed=i, pad_output=True)
      steps += longest
    return None, steps, int(budgets.sum())

  return tunix


def _timed(fn, repeats: int, warmup=None):
  (warmup or fn)()  # compilation
  times, result = [], None
  for _ in range(repeats):
    started = time.perf_counter()
    result = jax.block_until_ready(fn())
    times.append(time.perf_counter() - started)
  return float(np.median(times)), result


def rows_for(name: str, args, directory: str) -> list[list]:
  config = preset(name, qkv_bias=True)
  if peers.tunix_qwen2 is None:
    model, theirs = Transformer(config, rngs=nnx.Rngs(0)), None
  else:
    model, theirs = peers.both_models(config, f"{directory}/{name}")
  prompts = jax.random.randint(jax.random.key(1), (args.prompts, PROMPT), 1, config.vocab_size)
  rows = []
  for kind in ("long tail", "equal"):
    budgets = lengths(kind.split()[0], args.prompts * args.group, p50=args.p50, p99=args.p99,
                      budget=args.budget)
    for slots in args.slots:
      engines = _engines(model, prompts, args.group, slots, args.budget, jnp.asarray(budgets),
                         args.partial_calls)
      if theirs is not None:
        engines["tunix (static)"] = _tunix_engine(theirs, config, prompts, args.group, slots,
                                                  args.budget, budgets)
      # Responses of 1 token compile the static and continuous engines' programs in moments.
      short = _engines(model, prompts, args.group, slots, args.budget,
                       jnp.ones_like(budgets), args.partial_calls)
      warmups = {engine: short[engine] for engine in ("static", "continuous")}
      measured = {engine: _timed(fn, args.repeats, warmups.get(engine))
                  for engine, fn in engines.items()}
      np.testing.assert_array_equal(measured["static"][1][0], measured["continuous"][1][0])
      assert measured["static"][1][2] == measured["continuous"][1][2] == int(budgets.sum())
      speed = {engine: generated / seconds
               for engine, (seconds, (_, _, generated)) in measured.items()}
      for engine, (seconds, (_, steps, generated)) in measured.items():
        rows.append([name, kind, slots, engine, f"{speed[engine]:,.0f}", f"{steps:,}",
                     f"{generated / steps:.1f}", f"{generated:,}", f"{seconds:.1f}",
                     f"{speed[engine] / speed['static']:.2f}x"])
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
  parser.add_argument("--partial-calls", type=int, default=4,
                      help="calls of the partial-rollouts engine, each admitting a batch")
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
  if peers.tunix_qwen2 is None:
    print("tunix is not installed here: its rows are left out (run with .venv-bench).\n")
  with tempfile.TemporaryDirectory() as directory:
    rows = [row for name in args.presets for row in rows_for(name, args, directory)]
  print(table(["model", "lengths", "slots", "engine", "generated tok/s", "decode steps",
               "live rows a step", "tokens", "seconds", "vs static"], rows))


if __name__ == "__main__":
  main()
