"""The unbiased per-turn baseline at hundreds of turns: its mean advantage at every turn.

  python -m studies.turn_study.baseline_check --out studies/turn_study/results/baseline_check.md

key_turns with 256 one-token turns, two decisive turns at the first and the last turn (so
no turn's outcome is decided before the episode ends) and every other action hidden from
later turns (the exact turn values stay tractable). Episodes are sampled by
`rollout_sources.MultiTurn` from a random policy leaning toward the keys (its embeddings
share one direction, the keys' more: J near 0.1); `MultiTurn.returns_to_go` branches
`samples` continuations from every turn's start (the baseline b_k, their mean reward),
and `turn_baseline` gives A_k = G_k - b_k on each turn's first action token. Per turn the
report gives the mean of A_k over episodes and its z-score (mean / standard error), and the
baseline's mean error against the exact V(h_k) (`key_turns.oracle.turn_credit`).
"""

import argparse
import pathlib
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcredit import estimators
from jaxcredit.models import Transformer, preset
from jaxcredit.tasks import key_turns


def leaning_policy(seed: int, lean: float = 1.0) -> Transformer:
  """The study's 1-layer policy with random weights whose embeddings share one direction, the
  keys' with weight `lean` and the other tokens' half of it: it emits a key most often, its
  odds depending on the context."""
  model = Transformer(preset("tiny", vocab_size=key_turns.VOCAB_SIZE, n_layers=1, d_model=64,
                             n_heads=4, n_kv_heads=4, d_ff=128, attention_block=128),
                      rngs=nnx.Rngs(seed))
  embedding = np.asarray(model.embed_tokens.embedding[...])
  direction = np.random.default_rng(seed).normal(size=embedding.shape[1])
  weights = np.full((len(embedding), 1), lean / 2)
  weights[key_turns.KeyTurnsConfig().keys] = lean
  tilted = 0.05 * embedding + weights * direction / np.linalg.norm(direction)
  model.embed_tokens.embedding[...] = jnp.asarray(tilted, embedding.dtype)
  return model


def turn_advantages(model, config, episodes: int, samples: int, seed: int):
  """(A [episodes, K], b_k - V(h_k) [episodes, K], continuation tokens) for `episodes`
  episodes sampled with key `seed`."""
  rollout, examples = key_turns.sample_episodes(model, config, episodes, seed)
  source = key_turns.episode_source(config)
  baselines, generated = source.returns_to_go(model, rollout, examples, samples=samples,
                                              key=jax.random.fold_in(jax.random.key(seed), 1))
  values, _ = key_turns.oracle.turn_credit(model, config, rollout.tokens, rollout.token_valid)
  starts = np.asarray(estimators.turn_starts(rollout.turn_ids, rollout.mask))
  rollout = rollout.replace(extras={**rollout.extras, "turn_baselines": jnp.asarray(baselines)})
  advantages = np.asarray(estimators.get("turn_baseline")(rollout).advantages)
  shape = (episodes, config.n_turns)
  return (advantages[starts].reshape(shape),
          baselines[starts].reshape(shape) - values[:, :-1], generated)


def report(advantages: np.ndarray, errors: np.ndarray, config, header: str) -> str:
  """The markdown report of A [N, K] and the baselines' errors b_k - V(h_k) [N, K].

  Episodes are independent, the turns of one episode are not: A_k = (R - V(h_k)) +
  (V(h_k) - b_k) shares the episode's reward R across its turns, so the test over every
  turn at once is on each episode's mean A over its turns (a t-statistic over episodes).
  The baseline's errors are independent across turns given the episode (fresh
  continuations at every turn), so their per-turn z-scores are counted against the normal
  tails."""
  n, k = advantages.shape
  z_of = lambda x: x.mean(0) / np.maximum(x.std(0, ddof=1) / np.sqrt(len(x)), 1e-12)
  per_episode = advantages.mean(1)
  z, z_error = z_of(advantages), z_of(errors)
  lines = [header, "",
           f"{n} episodes of {k} turns (decisive turns {config.decisive}); A_k = G_k - b_k at "
           "each turn's first action token.", "",
           "| | |", "|---|---|",
           f"| mean A_k over turns and episodes | {per_episode.mean():+.4f} |",
           f"| its z over episodes (each episode's mean A over its turns) | "
           f"{z_of(per_episode[:, None])[0]:+.2f} |",
           f"| z of mean A_k per turn: max abs (turns share their episode's R) | "
           f"{np.abs(z).max():.2f} |",
           f"| b_k - V(h_k): mean | {errors.mean():+.4f} |",
           f"| b_k - V(h_k): turns with abs z > 2 (expected 5% of {k}: {0.05 * k:.0f}) | "
           f"{np.sum(np.abs(z_error) > 2)} |",
           f"| b_k - V(h_k): turns with abs z > 3 (expected {0.0027 * k:.1f}) | "
           f"{np.sum(np.abs(z_error) > 3)} |",
           f"| b_k - V(h_k): mean z^2 (1 when unbiased) | {np.mean(z_error**2):.2f} |", "",
           "| turn | mean A_k | std A_k | z | mean b_k - V(h_k) | its z |",
           "|---|---|---|---|---|---|"]
  for turn in sorted({0, 1, 2, 3, k // 4, k // 2, 3 * k // 4, k - 2, k - 1}):
    lines.append(f"| {turn} | {advantages[:, turn].mean():+.4f} | {advantages[:, turn].std():.4f}"
                 f" | {z[turn]:+.2f} | {errors[:, turn].mean():+.4f} | {z_error[turn]:+.2f} |")
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--turns", type=int, default=256)
  parser.add_argument("--episodes", type=int, default=16, help="episodes in all")
  parser.add_argument("--chunk", type=int, default=4, help="episodes sampled at once")
  parser.add_argument("--samples", type=int, default=2, help="continuations per turn start")
  parser.add_argument("--out", type=pathlib.Path, required=True)
  args = parser.parse_args()
  if args.episodes % args.chunk:
    raise ValueError(f"--episodes ({args.episodes}) must be a multiple of --chunk ({args.chunk}).")
  config = key_turns.KeyTurnsConfig(n_turns=args.turns, decisive=(0, args.turns - 1),
                                    hidden_actions=True)
  model = leaning_policy(0)
  started, parts, tokens = time.perf_counter(), [], 0
  for seed in range(args.episodes // args.chunk):
    advantages, errors, generated = turn_advantages(model, config, args.chunk, args.samples, seed)
    parts.append((advantages, errors))
    tokens += generated
    print(f"[baseline check] {len(parts) * args.chunk} episodes, "
          f"{time.perf_counter() - started:.0f} s", flush=True)
  advantages, errors = (np.concatenate(x) for x in zip(*parts))
  prompt = key_turns.make_example(np.random.default_rng(0), config)["prompt"]
  j = float(key_turns.oracle.success(model, config, prompt))
  header = (f"# python -m studies.turn_study.baseline_check, run {time.strftime('%Y-%m-%d')}\n\n"
            f"{platform.processor() or platform.machine()}, {jax.devices()[0].platform}; "
            f"J = {j:.3f}; {args.samples} continuations per turn start, {tokens:,} continuation "
            f"tokens; {time.perf_counter() - started:.0f} s.")
  args.out.write_text(report(advantages, errors, config, header))
  np.savez(args.out.with_suffix(".npz"), advantages=advantages, baseline_errors=errors)
  print(args.out.read_text())


if __name__ == "__main__":
  main()
