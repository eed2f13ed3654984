"""The learner's gradient on a tree rollout: each shared prefix computed once
(`forward.policy_outputs(..., tree=)`) against the unrolled rows (`forward.policy_outputs`).

python -m bench.tree_pass [--preset small --prompt 32 --segment 32 --repeats 5]

One 4-ary tree of depth 3 per prompt (roots 1, branching 4: 64 leaves), a P-token prompt
and four segments of `--segment` tokens. The loss is the sum of the leaves' response
log-probs (a policy gradient's shape); both programs compute the same gradient (checked
here). From the compiled programs: FLOPs (`cost_analysis`), temporaries and arguments
(`memory_analysis`); and the median wall time of the jitted gradient.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.common import machine, table, time_calls
from jaxcredit import forward
from jaxcredit.models import Transformer, preset
from jaxcredit.rollout import Rollout
from jaxcredit.sampling import TreeSpec

MiB = 2**20


def tree_rows(spec: TreeSpec, prompts: int, prompt: int, vocab: int, seed: int = 0) -> Rollout:
  """Whole trees' rows: every node's tokens drawn once and shared by the rows below it."""
  rng = np.random.default_rng(seed)
  rows = prompts * spec.leaves
  budgets = spec.budgets(spec.depth * spec.segment_tokens + spec.segment_tokens)
  columns = [rng.integers(1, vocab, (prompts, prompt)).repeat(spec.leaves, 0)]
  for level, width in enumerate(budgets):
    block = spec.branching ** (spec.depth - level)
    columns.append(rng.integers(1, vocab, (rows // block, width)).repeat(block, 0))
  tokens = np.concatenate(columns, axis=1)
  mask = np.zeros(tokens.shape, bool)
  mask[:, prompt:] = True
  length = tokens.shape[1]
  return Rollout(tokens=jnp.asarray(tokens, jnp.int32), mask=jnp.asarray(mask),
                 rewards=jnp.zeros(rows), token_valid=jnp.ones(tokens.shape, bool),
                 positions=jnp.broadcast_to(jnp.arange(length), tokens.shape),
                 group_size=spec.leaves)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="small")
  parser.add_argument("--prompts", type=int, default=1)
  parser.add_argument("--prompt", type=int, default=32)
  parser.add_argument("--segment", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)
  spec = TreeSpec(roots=1, branching=4, depth=3, segment_tokens=args.segment)
  model = Transformer(preset(args.preset), rngs=nnx.Rngs(0))
  rollout = tree_rows(spec, args.prompts, args.prompt, model.config.vocab_size)
  graphdef, state = nnx.split(model)

  def gradient(shared: bool):
    def loss(state):
      policy = nnx.merge(graphdef, state)
      tree = dict(tree=spec, prompt_length=args.prompt) if shared else {}
      outputs = forward.policy_outputs(policy, rollout, 1.0, **tree)
      return jnp.sum(jnp.where(rollout.mask, outputs.logprobs, 0.0))
    return jax.jit(jax.grad(loss))

  programs = {"unrolled rows": gradient(False), "prefix-shared tree": gradient(True)}
  compiled = {name: fn.lower(state).compile() for name, fn in programs.items()}
  unrolled, shared = (jax.tree.leaves(c(state)) for c in compiled.values())
  scale = max(float(jnp.max(jnp.abs(g))) for g in unrolled)
  error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(unrolled, shared)) / scale
  seconds = time_calls(compiled, state, repeats=args.repeats)
  rows, length = rollout.shape
  tokens = {"unrolled rows": rows * length,
            "prefix-shared tree": args.prompts * (args.prompt
                                                  + spec.slots(length - args.prompt))}
  print(f"# Tree pass: {args.preset}, {args.prompts} x 4-ary depth-3 tree (64 leaves), "
        f"prompt {args.prompt}, segments of {args.segment} tokens\n")
  print(f"Machine: {machine()}\n")
  table_rows = []
  for name, program in compiled.items():
    cost, memory = program.cost_analysis(), program.memory_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    table_rows.append([name, f"{tokens[name]:,}", f"{cost['flops'] / 1e9:.2f}",
                       f"{memory.temp_size_in_bytes / MiB:.1f}",
                       f"{memory.argument_size_in_bytes / MiB:.1f}",
                       f"{seconds[name] * 1e3:.0f}"])
  print(table(["gradient of", "tokens computed", "GFLOPs", "temporaries MiB", "arguments MiB",
               "ms"], table_rows))
  flops = [float(r[2]) for r in table_rows]
  print(f"\nFLOPs saved: {flops[0] / flops[1]:.2f}x; time saved: "
        f"{seconds['unrolled rows'] / seconds['prefix-shared tree']:.2f}x; largest gradient "
        f"difference {error:.1e} of the largest entry.")


if __name__ == "__main__":
  main()
