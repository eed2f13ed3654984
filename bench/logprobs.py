"""Memory and time of per-token log-probs at LLM vocabulary size.

python bench/logprobs.py [--batch 4 --length 1024 --vocab 152064 --dim 896 --chunk 64]

Compares, forward and forward+backward (gradients for hidden and unembed):
  naive          token_logprobs(hidden @ unembed, tokens): materialises [B, T, V]
  scan + remat   lax.scan over time chunks with jax.checkpoint on each chunk
                 and plain autodiff (the approach of tunix and most JAX codebases)
  jaxcredit      chunked_token_logprobs: custom VJP whose backward recomputes the
                 logits one vocabulary chunk at a time and writes d unembed in place
Peak memory is XLA's compiled buffer assignment (arguments + outputs + temporaries).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from bench.common import machine, table, time_call
from jaxcredit import logprobs


def naive(hidden, unembed, tokens):
  return logprobs.token_logprobs(jnp.einsum("btd,dv->btv", hidden, unembed), tokens)


def scan_remat(chunk):
  def fn(hidden, unembed, tokens):
    b, t, d = hidden.shape
    h = jnp.swapaxes(hidden.reshape(b, t // chunk, chunk, d), 0, 1)
    tok = jnp.swapaxes(tokens.reshape(b, t // chunk, chunk), 0, 1)

    @jax.checkpoint
    def chunk_logp(h_c, tok_c):
      return logprobs.token_logprobs(jnp.einsum("bcd,dv->bcv", h_c, unembed), tok_c)

    _, out = jax.lax.scan(lambda _, x: (None, chunk_logp(*x)), None, (h, tok))
    return jnp.swapaxes(out, 0, 1).reshape(b, t)

  return fn


def ours(chunk):
  return lambda hidden, unembed, tokens: logprobs.chunked_token_logprobs(
      hidden, unembed, tokens, chunk_size=chunk
  )


def forward_backward(fn, weights):
  return jax.value_and_grad(lambda h, w, tok: jnp.sum(weights * fn(h, w, tok)), argnums=(0, 1))


def peak_bytes(jitted, *args) -> tuple[int, int]:
  """(arguments + outputs + temporaries, temporaries) of the compiled program."""
  stats = jitted.lower(*args).compile().memory_analysis()
  fixed = stats.argument_size_in_bytes + stats.output_size_in_bytes
  return fixed + stats.temp_size_in_bytes, stats.temp_size_in_bytes


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--length", type=int, default=1024)
  parser.add_argument("--vocab", type=int, default=152064)
  parser.add_argument("--dim", type=int, default=896)
  parser.add_argument("--chunk", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.normal(size=(args.batch, args.length, args.dim)), jnp.float32)
  unembed = jnp.asarray(rng.normal(size=(args.dim, args.vocab)) / np.sqrt(args.dim), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, args.vocab, (args.batch, args.length)))
  weights = jnp.asarray(rng.normal(size=(args.batch, args.length)), jnp.float32)
  print(f"# Log-prob benchmark\n\nmachine: {machine()}\n")
  print(f"B*T = {args.batch * args.length}, V = {args.vocab}, D = {args.dim}, "
        f"chunk = {args.chunk} steps x {args.batch} rows, float32\n")
  variants = {"naive": naive, "scan + remat": scan_remat(args.chunk), "jaxcredit": ours(args.chunk)}
  results = {}
  for name, fn in variants.items():
    forward = jax.jit(fn)
    both = jax.jit(forward_backward(fn, weights))
    results[name] = (
        peak_bytes(forward, hidden, unembed, tokens),
        time_call(forward, hidden, unembed, tokens, repeats=args.repeats),
        peak_bytes(both, hidden, unembed, tokens),
        time_call(both, hidden, unembed, tokens, repeats=args.repeats),
    )
  base = results["naive"]
  gib = lambda n: f"{n / 2**30:.2f}"
  rows = [
      [name, gib(f_mem[0]), f"{f_time:.2f}", gib(b_mem[0]), gib(b_mem[1]), f"{b_time:.2f}",
       f"{b_mem[0] / base[2][0]:.2f}x", f"{b_mem[1] / base[2][1]:.2f}x", f"{b_time / base[3]:.2f}x"]
      for name, (f_mem, f_time, b_mem, b_time) in results.items()
  ]
  print(table(["variant", "fwd peak (GiB)", "fwd time (s)", "fwd+bwd peak (GiB)",
               "fwd+bwd temporaries (GiB)", "fwd+bwd time (s)", "peak / naive",
               "temporaries / naive", "time / naive"], rows))
  print("\npeak includes the inputs and the gradients themselves (hidden, unembed and their"
        " gradients: the floor any method pays); temporaries are what the method adds.")


if __name__ == "__main__":
  main()
