"""Compiled memory of one learner gradient at real model shapes, no weights allocated.

python -m bench.memory [--models qwen2.5-0.5b qwen2.5-1.5b] [--shapes 8x1024 1x131072/8]
python -m bench.memory --depths 4 24 48    # compile time against depth (scanned layers)

For each model preset (bf16 compute, float32 parameters) and batch shape B x L
(B x L/N: the rows sharded along their length over a `sequence` mesh axis of N
forced CPU devices, `jaxcredit.models.context_parallel`; memory per device),
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
(B * L * D * n_layers * 2 bytes; per device, L / N tokens of it).
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from bench.common import machine, table
from jaxcredit import forward, logprobs, losses
from jaxcredit.models import Transformer, preset, sharding

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
      logp, _ = forward.shifted_logprobs(model, out.hidden, tokens,
                                         logits_per_chunk=logits_per_chunk)
    else:
      logits = model(tokens).logits
      logp = jnp.pad(logprobs.token_logprobs(logits[:, :-1], tokens[:, 1:]), [(0, 0), (1, 0)])
    ratio = jnp.exp(logp - old_logprobs)
    clipped = jnp.minimum(ratio * advantages, jnp.clip(ratio, 0.8, 1.2) * advantages)
    return -losses.aggregate(clipped, mask, "token-mean")

  return jax.jit(jax.grad(loss))


def measure(name: str, batch: int, length: int, logits_per_chunk: int, attention: str,
            chunked_head: bool, remat: str, sequence: int = 1, **overrides):
  """(temp bytes, argument bytes, compile seconds) of the gradient on one device,
  or per device with the rows sharded `sequence` ways along their length."""
  config = preset(name, dtype=jnp.bfloat16, attention=attention, remat=remat, max_position=None,
                  **overrides)  # a shape, measured past the checkpoint's RoPE range too
  abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  mesh = sharding.make_mesh((1, 1, sequence, 1))
  place = lambda x, *spec: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                sharding=NamedSharding(mesh, PartitionSpec(*spec)))
  state = jax.tree.map(place, state)  # parameters replicated over the sequence axis
  rows = lambda dtype: place(jax.ShapeDtypeStruct((batch, length), dtype), None, "sequence")
  start = time.perf_counter()
  with jax.set_mesh(mesh):
    compiled = rl_gradient(graphdef, chunked_head, logits_per_chunk).lower(
        state, rows(jnp.int32), rows(bool), rows(jnp.float32), rows(jnp.float32)).compile()
  stats = compiled.memory_analysis()
  return stats.temp_size_in_bytes, stats.argument_size_in_bytes, time.perf_counter() - start


def parse_shape(shape: str) -> tuple[int, int, int]:
  """"BxL" or "BxL/N" -> (B, L, N)."""
  rows, _, sequence = shape.partition("/")
  batch, length = map(int, rows.split("x"))
  return batch, length, int(sequence or 1)


def floor_bytes(name: str, batch: int, length: int, sequence: int = 1) -> int:
  config = preset(name)
  params = sum(x.size for x in jax.tree.leaves(
      nnx.state(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))), nnx.Param)))
  return 4 * params * 4 + batch * length // sequence * config.d_model * config.n_layers * 2


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--models", nargs="+", default=["qwen2.5-0.5b"])
  parser.add_argument("--shapes", nargs="+",
                      default=["8x1024", "8x4096", "1x32768", "1x131072/8"])
  parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
  parser.add_argument("--logits_per_chunk", type=int, default=forward.LOGITS_PER_CHUNK)
  parser.add_argument("--depths", nargs="+", type=int, default=None)
  args = parser.parse_args()
  devices = max(parse_shape(shape)[2] for shape in args.shapes)
  if jax.device_count() < devices:  # forced CPU devices must be set before jax starts
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    os.execve(sys.executable, [sys.executable, "-m", "bench.memory", *sys.argv[1:]], env)
  print(f"# Learner memory benchmark\n\nmachine: {machine()}\n")
  if args.depths:
    return depth_table(args)
  print("gradient of PPO-clip on per-token log-probs, bf16 compute, float32 parameters, "
        f"{args.logits_per_chunk:,} logits per log-prob chunk; GiB from XLA's compiled memory "
        "analysis (CPU backend)\n")
  rows = []
  for name in args.models:
    for shape in args.shapes:
      batch, length, sequence = parse_shape(shape)
      cells = []
      for variant in args.variants:
        temp, arguments, seconds = measure(name, batch, length, args.logits_per_chunk,
                                           *VARIANTS[variant], sequence=sequence)
        cells.append(f"{temp / GiB:.2f}")
      per_device = f" / {sequence} devices" if sequence > 1 else ""
      rows.append([name, f"{batch} x {length:,}{per_device}", *cells, f"{arguments / GiB:.2f}",
                   f"{floor_bytes(name, batch, length, sequence) / GiB:.2f}"])
      print(table(["model", "B x L", *(f"temp: {v}" for v in args.variants), "arguments",
                   "floor"], rows[-1:]).splitlines()[-1], flush=True)
  print()
  print(table(["model", "B x L", *(f"temp: {v}" for v in args.variants), "arguments", "floor"],
              rows))


def depth_table(args):
  """Compile time and temporaries of the gradient against the number of layers."""
  name, shape = args.models[0], args.shapes[0]
  batch, length, _ = parse_shape(shape)
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
