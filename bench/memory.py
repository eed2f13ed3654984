"""Compiled memory of one learner gradient at real model shapes, no weights allocated.

python -m bench.memory [--models qwen2.5-0.5b qwen2.5-1.5b] [--shapes 8x1024 8x4096 1x32768]
python -m bench.memory --depths 4 24 48    # compile time against depth (scanned layers)

For each model preset (bf16 compute, float32 parameters) and batch shape B x L,
XLA compiles the gradient of the RL objective (PPO-clip on per-token log-probs
of the policy over whole [B, L] rows) and reports, from the compiled program
(`memory_analysis()`, nothing is run), its temporaries and its arguments:

  dense logits, xla attention   the [B, L, V] logits and [B, H, L, L] scores (the
                                learner before the chunked head)
  chunked head, xla attention   log-probs and entropies from hidden states
                                (`chunked_token_logprobs_and_entropy`)
  chunked head + attention      and blockwise attention (`attention="chunked"`,
                                the default)
  + remat block                 and the scanned layers rematerialised
                                (`remat="block"`: the backward keeps each
                                layer's input only)

The floor beside them is what any trainer holds: float32 parameters,
gradients and Adam's two moments, plus the bf16 residual stream of every layer
(B * L * D * n_layers * 2 bytes).
"""

import argparse
import time

import jax
import jax.numpy as jnp
from flax import nnx

from bench.common import machine, table
from jaxcredit import logprobs, losses
from jaxcredit.models import Transformer, preset
from jaxcredit.train import steps

GiB = 2**30
VARIANTS = {
    "dense logits, xla attention": ("xla", False, "none"),
    "chunked head, xla attention": ("xla", True, "none"),
    "chunked head + attention": ("chunked", True, "none"),
    "+ remat block": ("chunked", True, "block"),
}


def rl_gradient(graphdef, chunked_head: bool, logits_per_chunk: int):
  """grad of a PPO-clip token-mean loss of the policy's log-probs on [B, L] rows."""

  def loss(state, tokens, mask, advantages, old_logprobs):
    model = nnx.merge(graphdef, state)
    if chunked_head:
      out = model(tokens, logits=False)
      logp, _ = steps.shifted_logprobs(model, out.hidden, tokens, logits_per_chunk=logits_per_chunk)
    else:
      logits = model(tokens).logits
      logp = jnp.pad(logprobs.token_logprobs(logits[:, :-1], tokens[:, 1:]), [(0, 0), (1, 0)])
    ratio = jnp.exp(logp - old_logprobs)
    clipped = jnp.minimum(ratio * advantages, jnp.clip(ratio, 0.8, 1.2) * advantages)
    return -losses.aggregate(clipped, mask, "token-mean")

  return jax.jit(jax.grad(loss))


def measure(name: str, batch: int, length: int, logits_per_chunk: int, attention: str,
            chunked_head: bool, remat: str, **overrides):
  config = preset(name, dtype=jnp.bfloat16, attention=attention, remat=remat, **overrides)
  abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  rows = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  floats = jax.ShapeDtypeStruct((batch, length), jnp.float32)
  start = time.perf_counter()
  compiled = rl_gradient(graphdef, chunked_head, logits_per_chunk).lower(
      state, rows, jax.ShapeDtypeStruct((batch, length), bool), floats, floats).compile()
  stats = compiled.memory_analysis()
  return stats.temp_size_in_bytes, stats.argument_size_in_bytes, time.perf_counter() - start


def floor_bytes(name: str, batch: int, length: int) -> int:
  config = preset(name)
  params = sum(x.size for x in jax.tree.leaves(
      nnx.state(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))), nnx.Param)))
  return 4 * params * 4 + batch * length * config.d_model * config.n_layers * 2


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--models", nargs="+", default=["qwen2.5-0.5b"])
  parser.add_argument("--shapes", nargs="+", default=["8x1024", "8x4096", "1x32768"])
  parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
  parser.add_argument("--logits_per_chunk", type=int, default=steps.LOGITS_PER_CHUNK)
  parser.add_argument("--depths", nargs="+", type=int, default=None)
  args = parser.parse_args()
  print(f"# Learner memory benchmark\n\nmachine: {machine()}\n")
  if args.depths:
    return depth_table(args)
  print("gradient of PPO-clip on per-token log-probs, bf16 compute, float32 parameters, "
        f"{args.logits_per_chunk:,} logits per log-prob chunk; GiB from XLA's compiled memory "
        "analysis (CPU backend)\n")
  rows = []
  for name in args.models:
    for shape in args.shapes:
      batch, length = map(int, shape.split("x"))
      cells = []
      for variant in args.variants:
        temp, arguments, seconds = measure(name, batch, length, args.logits_per_chunk,
                                           *VARIANTS[variant])
        cells.append(f"{temp / GiB:.2f}")
      rows.append([name, f"{batch} x {length:,}", *cells, f"{arguments / GiB:.2f}",
                   f"{floor_bytes(name, batch, length) / GiB:.2f}"])
      print(table(["model", "B x L", *(f"temp: {v}" for v in args.variants), "arguments",
                   "floor"], rows[-1:]).splitlines()[-1], flush=True)
  print()
  print(table(["model", "B x L", *(f"temp: {v}" for v in args.variants), "arguments", "floor"],
              rows))


def depth_table(args):
  """Compile time and temporaries of the gradient against the number of layers."""
  name, shape = args.models[0], args.shapes[0]
  batch, length = map(int, shape.split("x"))
  print(f"{name} width, B x L = {shape}, chunked head + attention + remat block; compile time "
        "includes lowering\n")
  rows = []
  for depth in args.depths:
    temp, _, seconds = measure(name, batch, length, args.logits_per_chunk,
                               *VARIANTS["+ remat block"], n_layers=depth)
    rows.append([depth, f"{seconds:.1f}", f"{temp / GiB:.2f}"])
  print(table(["layers", "compile (s)", "temp (GiB)"], rows))


if __name__ == "__main__":
  main()
