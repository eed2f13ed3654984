"""jaxcredit against google-tunix, in one process, on the same Qwen2 weights.

    python3 -m venv .venv-bench && .venv-bench/bin/pip install -e '.[bench]'
    .venv-bench/bin/python -m bench.peers [--repeats 5] [--skip-large]

tunix pins versions of transformers and safetensors that differ from the test
extra's, hence its own environment. Without tunix the benchmark says so and
exits.

Weights: a jaxcredit `Transformer` with a Qwen2 configuration is written as a
Hugging Face checkpoint (`models.save_hf_checkpoint`) and read by tunix's own
loader (`tunix.models.qwen2.params.create_model_from_safe_tensors`); every
tensor maps (q/k/v/o, biases, MLP, norms, the tied embedding). Both models'
logits on the same tokens are compared before anything is timed.

1. Sampling, temperature 1, KV cache, generated tokens/s: jaxcredit
   `sampling.generate` vs tunix `generate.Sampler` (top_p=1.0, which is its
   plain categorical sampling, with the per-token log-probs an RL rollout
   needs). Both stop a batch once every row has emitted an end-of-sequence
   token and otherwise run all steps (a finished row is still computed); here
   no end token is ever produced, so both generate batch x new tokens.
   tunix's call includes its host-side (de)tokenisation of the id strings
   below, jaxcredit's the copy of the tokens to the host. Decoding a token
   reads every weight (the tied embedding as the output head) and the KV
   cache once; the "bound" column divides those bytes by the speed at which
   this machine streams a weight matrix through a batch-row matmul (the
   output head's own [batch, D] x [D, V] product, timed in the same run), and
   "of bound" is the tokens/s reached as a fraction of that. The plain read
   speed of the same weight (a sum) is printed beside it: the gap between the
   two is XLA:CPU's matmul kernel at a few rows, not the memory.
2. One GRPO policy update on a fixed batch (prompts x samples rows, prompt
   64, responses of 64-256 tokens): jaxcredit's learner step (GRPO advantages,
   PPO-clip, Adam) vs tunix's `grpo_loss_fn` under `nnx.value_and_grad` and
   `optimizer.update`, exactly as tunix's trainer runs it (beta = 0: no
   reference model in either). ms per step and XLA's compiled temporaries;
   jaxcredit both with its default scan over layers and with them unrolled
   (`scan_layers=False`, as tunix's models loop over their layers). XLA's
   cost analysis counts a loop body once, so the GFLOP column undercounts
   programs with loops (jaxcredit's chunked head, its scan over layers).
3. Per-token log-probs, forward + backward, V = 152064, D = 896, B*T = 4096:
   jaxcredit `chunked_token_logprobs` vs tunix's path, the full logits of
   `Embedder.decode` through `common.selective_log_softmax` (tunix 0.1.7 has
   no chunked log-prob path).

Times are medians of `--repeats` runs after one warm-up run; the first call
(compilation + one run) is reported separately.
"""

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from bench.common import machine, table, time_call, time_calls
from bench.logprobs import forward_backward
from jaxcredit import estimators, logprobs, losses
from jaxcredit.models import Transformer, preset, save_hf_checkpoint
from jaxcredit.rollout import Rollout
from jaxcredit.sampling import generate
from jaxcredit.train import learner

try:
  from tunix.generate import sampler as tunix_sampler
  from tunix.models.qwen2 import model as tunix_qwen2
  from tunix.models.qwen2 import params as tunix_params
  from tunix.rl import algo_core as tunix_algo
  from tunix.rl import common as tunix_common
  from tunix.rl.grpo import grpo_learner as tunix_grpo
except ImportError:
  tunix_qwen2 = None

# A small Qwen2 for the sampler's batch-32 shape and the GRPO step (a step of 256 rows of up to
# 320 tokens takes seconds on a 2-core CPU), and Qwen2.5-0.5B's shape for the larger sampling.
SMALL = dict(vocab_size=8192, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=512,
             head_dim=32)


def _timed(fn, repeats: int) -> tuple[float, float]:
  """(seconds of the first call, median seconds of `repeats` calls after a warm-up)."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start, time_call(fn, repeats=repeats)


class IdTokenizer:
  """Token ids written as text ("17 5 9"): tunix's sampler takes strings."""

  def __init__(self, eos: int):
    self.eos = eos

  def encode(self, text, **_):
    return [int(t) for t in text.split()]

  def decode(self, ids, **_):
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self):
    return 0  # falsy: tunix adds no BOS

  def eos_id(self):
    return self.eos

  def pad_id(self):
    return 0


def both_models(config, directory: str):
  """(jaxcredit model, tunix model) with the same weights, via a HF checkpoint."""
  ours = Transformer(config, rngs=nnx.Rngs(0))
  save_hf_checkpoint(ours, directory)
  theirs_config = tunix_qwen2.ModelConfig(
      num_layers=config.n_layers, vocab_size=config.vocab_size, embed_dim=config.d_model,
      hidden_dim=config.d_ff, num_heads=config.n_heads, head_dim=config.resolved_head_dim,
      num_kv_heads=config.n_kv_heads, rope_theta=int(config.rope_theta), norm_eps=config.norm_eps,
      use_tied_embedding=config.tie_embeddings, dtype=config.dtype, param_dtype=config.param_dtype)
  theirs = tunix_params.create_model_from_safe_tensors(directory, theirs_config)
  return ours, theirs


def logits_gap(ours, theirs, vocab: int) -> float:
  """max |logits difference| of the two models on the same random tokens."""
  tokens = jnp.asarray(np.random.default_rng(1).integers(1, vocab, (2, 16)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(16), tokens.shape)
  mine = ours(tokens, positions=positions, token_valid=jnp.ones(tokens.shape, bool)).logits
  causal = jnp.broadcast_to(jnp.tril(jnp.ones((16, 16), bool)), (2, 16, 16))
  their, _ = theirs(tokens, positions, None, causal)
  return float(jnp.max(jnp.abs(mine - their)))


def streaming_bandwidths(config, batch: int, repeats: int) -> tuple[float, float]:
  """Bytes/s at which this machine reads the [V, D] float32 output-head weight: in a
  [batch, D] x [D, V] matmul, and in a plain sum (memory read speed)."""
  weight = jnp.ones((config.vocab_size, config.d_model), jnp.float32)
  rows = jnp.ones((batch, config.d_model), jnp.float32)
  times = time_calls({"matmul": jax.jit(lambda x, w: x @ w.T),
                      "sum": jax.jit(lambda x, w: jnp.sum(w))}, rows, weight,
                     repeats=max(repeats, 10))
  return weight.nbytes / times["matmul"], weight.nbytes / times["sum"]


def decode_bytes(model, config, *, batch: int, length: int) -> int:
  """Bytes one decode step reads: every parameter, and a KV cache of `length` positions."""
  params = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  cache = 2 * config.n_layers * batch * length * config.n_kv_heads * config.resolved_head_dim * 4
  return params + cache


def sampling_rows(ours, theirs, config, *, batch: int, prompt: int, new: int,
                  repeats: int) -> tuple[list[list], str]:
  vocab = config.vocab_size
  prompts = np.random.default_rng(0).integers(1, vocab, (batch, prompt))
  valid = jnp.ones(prompts.shape, bool)
  keys = iter(range(10**6))

  def jaxcredit_run():
    out = generate(ours, jnp.asarray(prompts), valid, jax.random.key(next(keys)),
                   max_new_tokens=new, temperature=1.0, stop_when_done=False)
    return np.asarray(out.tokens)

  cache = tunix_sampler.CacheConfig(cache_size=prompt + new, num_layers=config.n_layers,
                                    num_kv_heads=config.n_kv_heads,
                                    head_dim=config.resolved_head_dim)
  sampler = tunix_sampler.Sampler(theirs, IdTokenizer(eos=vocab), cache)  # id `vocab`: never drawn
  strings = [" ".join(map(str, row)) for row in prompts]

  def tunix_run():
    out = sampler(strings, max_generation_steps=new, max_prompt_length=prompt, temperature=1.0,
                  top_p=1.0, return_logprobs=True, seed=next(keys), pad_output=True)
    return out.tokens

  # Tokens/s if every decode step only streamed its bytes (cache at its mean length).
  step_bytes = decode_bytes(ours, config, batch=batch, length=prompt + new // 2)
  matmul_speed, read_speed = streaming_bandwidths(config, batch, repeats)
  bound = batch * matmul_speed / step_bytes
  rows = []
  shape = (f"d={config.d_model}, {config.n_layers} layers, V={config.vocab_size}; "
           f"batch {batch}, prompt {prompt}, {new} new")
  note = (f"{shape}: a decode step reads {step_bytes / 2**20:,.0f} MiB; this machine reads "
          f"the output head's weight at {matmul_speed / 1e9:.1f} GB/s in its batch-{batch} "
          f"matmul and at {read_speed / 1e9:.1f} GB/s in a plain sum")
  for name, run in (("jaxcredit", jaxcredit_run), ("tunix", tunix_run)):
    first, seconds = _timed(run, repeats)
    rate = batch * new / seconds
    rows.append([shape, name, f"{rate:,.0f}", f"{1e3 * seconds:,.0f}", f"{first:.1f}",
                 f"{bound:,.0f}", f"{rate / bound:.0%}"])
  return rows, note


def grpo_batch(config, *, prompts: int, group: int, prompt: int, response: int):
  """Random prompts and responses (lengths uniform in [response/4, response]),
  0/1 rewards; the same numbers in both libraries' formats."""
  rng = np.random.default_rng(2)
  rows = prompts * group
  prompt_ids = rng.integers(1, config.vocab_size, (rows, prompt))
  lengths = rng.integers(response // 4, response + 1, rows)
  completion_mask = np.arange(response)[None] < lengths[:, None]
  drawn = rng.integers(1, config.vocab_size, (rows, response))
  completion_ids = np.where(completion_mask, drawn, 0)
  rewards = rng.integers(0, 2, rows).astype(np.float32)
  return prompt_ids, completion_ids, completion_mask, rewards


def grpo_rows(ours, theirs, config, *, prompts: int, group: int, prompt: int, response: int,
              repeats: int) -> list[list]:
  prompt_ids, completion_ids, completion_mask, rewards = grpo_batch(
      config, prompts=prompts, group=group, prompt=prompt, response=response)
  tokens = jnp.asarray(np.concatenate([prompt_ids, completion_ids], 1), jnp.int32)
  valid = jnp.asarray(np.concatenate([np.ones_like(prompt_ids, bool), completion_mask], 1))
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  mask = valid.at[:, :prompt].set(False)
  # Behaviour log-probs = the policy's own, so the ratio starts at 1 in both.
  behaviour = logprobs.token_logprobs(
      ours(tokens, positions=positions, token_valid=valid).logits[:, :-1], tokens[:, 1:])
  behaviour = jnp.pad(behaviour, ((0, 0), (1, 0))) * mask
  # Reference log-probs given (beta = 0: tunix's step has no reference pass either).
  rollout = Rollout(tokens=tokens, mask=mask, rewards=jnp.asarray(rewards),
                    behaviour_logprobs=behaviour, ref_logprobs=behaviour, group_size=group,
                    positions=positions, token_valid=valid)
  optimizer = lambda model: nnx.Optimizer(model, optax.adam(1e-6), wrt=nnx.Param)

  def jaxcredit_step(model):
    graphdef, state = nnx.split({"model": model, "optimizer": optimizer(model)})
    step = learner.make_step(graphdef, advantage=estimators.from_config("grpo"),
                             objective=losses.from_config({"policy": {"name": "ppo_clip"}}),
                             settings=learner.Settings())
    return step, (state, rollout, None, 0)

  # The same weights with the layers unrolled (tunix's models loop over their layers).
  unrolled = Transformer(config.replace(scan_layers=False), rngs=nnx.Rngs(0))
  nnx.update(unrolled, nnx.state(ours))

  algo = tunix_grpo.GRPOConfig(num_generations=group, beta=0.0, epsilon=0.2)
  algo.temperature = 1.0  # as GRPOLearner sets it from the rollout config
  example = tunix_common.TrainExample(
      prompt_ids=jnp.asarray(prompt_ids, jnp.int32), prompt_mask=jnp.ones(prompt_ids.shape, bool),
      completion_ids=jnp.asarray(completion_ids, jnp.int32),
      completion_mask=jnp.asarray(completion_mask),
      advantages=jnp.asarray(tunix_algo.compute_advantages(rewards, group)),
      ref_per_token_logps=None, old_per_token_logps=behaviour[:, prompt:])
  their_graphdef, their_state = nnx.split((theirs, optimizer(theirs)))

  @jax.jit
  def tunix_step(state, example):
    model, opt = nnx.merge(their_graphdef, state)
    grad_fn = nnx.value_and_grad(tunix_algo.grpo_loss_fn, has_aux=True)
    (loss, _), grads = grad_fn(model, example, algo, 0, config.vocab_size)
    opt.update(model, grads)
    return nnx.state((model, opt)), loss

  out = []
  shape = (f"d={config.d_model}, {config.n_layers} layers; {prompts}x{group} rows, "
           f"prompt {prompt}, responses {response // 4}-{response}")
  for name, (step, args) in (("jaxcredit", jaxcredit_step(ours)),
                             ("jaxcredit, scan_layers=False", jaxcredit_step(unrolled)),
                             ("tunix", (tunix_step, (their_state, example)))):
    compiled = step.lower(*args).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    flops = compiled.cost_analysis()["flops"]
    first, seconds = _timed(lambda: step(*args), repeats)
    out.append([shape, name, f"{1e3 * seconds:,.0f}", f"{flops / 1e9:,.0f}", f"{temp / 2**30:.2f}",
                f"{first:.1f}"])
  return out


def logprob_rows(*, repeats: int, batch: int = 4, length: int = 1024, vocab: int = 152064,
                 dim: int = 896, chunk: int = 128) -> list[list]:
  rng = np.random.default_rng(3)
  hidden = jnp.asarray(rng.normal(size=(batch, length, dim)), jnp.float32)
  table_ = jnp.asarray(rng.normal(size=(vocab, dim)) * 0.02, jnp.float32)  # tied [V, D]
  tokens = jnp.asarray(rng.integers(0, vocab, (batch, length)), jnp.int32)
  weights = jnp.asarray(rng.normal(size=(batch, length)), jnp.float32)
  embedder = nnx.split(tunix_qwen2.Embedder(vocab_size=vocab, embed_dim=dim, rngs=nnx.Rngs(0),
                                             dtype=jnp.float32, param_dtype=jnp.float32))

  def ours(h, e, tok):
    return logprobs.chunked_token_logprobs(h, e, tok, chunk_size=chunk, vocab_major=True)

  def theirs(h, e, tok):
    graphdef, state = embedder
    decode = nnx.merge(graphdef, jax.tree.map(lambda _: e, state)).decode  # its one leaf := e
    return tunix_common.selective_log_softmax(decode(h), tok)

  out = []
  for name, fn in (("jaxcredit chunked_token_logprobs", ours),
                   ("tunix selective_log_softmax(Embedder.decode)", theirs)):
    step = jax.jit(forward_backward(fn, weights))
    temp = step.lower(hidden, table_, tokens).compile().memory_analysis().temp_size_in_bytes
    first, seconds = _timed(lambda: step(hidden, table_, tokens), repeats)
    out.append([name, f"{temp / 2**30:.2f}", f"{1e3 * seconds:,.0f}", f"{first:.1f}"])
  return out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--skip-large", action="store_true",
                      help="leave out the Qwen2.5-0.5B-shape sampling")
  parser.add_argument("--prompts", type=int, default=32, help="GRPO step: prompts")
  parser.add_argument("--group", type=int, default=8, help="GRPO step: samples per prompt")
  args = parser.parse_args()
  if tunix_qwen2 is None:
    raise SystemExit("tunix is not installed: python3 -m venv .venv-bench && "
                     ".venv-bench/bin/pip install -e '.[bench]', then run this with .venv-bench.")
  import tunix  # noqa: PLC0415 - only for its version
  print(f"# jaxcredit vs tunix {getattr(tunix, '__version__', '')}\n\nmachine: {machine()}\n")
  print(f"float32; medians of {args.repeats} runs after a warm-up; 'first call' is compilation "
        "plus one run.\n")
  shapes = [(preset("qwen2.5-0.5b", **SMALL), dict(batch=32, prompt=64, new=256))]
  if not args.skip_large:
    shapes.append((preset("qwen2.5-0.5b"), dict(batch=8, prompt=64, new=128)))
  sampling, notes, gaps = [], [], []
  with tempfile.TemporaryDirectory() as directory:
    for i, (config, shape) in enumerate(shapes):
      ours, theirs = both_models(config, f"{directory}/{i}")
      gaps.append(f"d={config.d_model}: {logits_gap(ours, theirs, config.vocab_size):.1e}")
      rows, note = sampling_rows(ours, theirs, config, repeats=args.repeats, **shape)
      sampling += rows
      notes.append(note)
      if i == 0:
        grpo = grpo_rows(ours, theirs, config, prompts=args.prompts, group=args.group, prompt=64,
                         response=256, repeats=args.repeats)
      del ours, theirs
  print(f"Same weights: max |logits(jaxcredit) - logits(tunix)| = {', '.join(gaps)}\n")
  print("## Sampling (temperature 1, KV cache)\n")
  print(table(["shape", "library", "tokens/s", "ms per batch", "first call (s)",
               "bound (tokens/s)", "of bound"], sampling))
  print("\n" + "\n".join(f"- {note}." for note in notes))
  print("\n## One GRPO policy update\n")
  print(table(["shape", "library", "ms per step", "GFLOP (XLA cost analysis)", "temp GiB",
               "first call (s)"], grpo))
  print("\n## Per-token log-probs, forward + backward (V = 152064, D = 896, B*T = 4096)\n")
  print(table(["implementation", "temp GiB", "ms", "first call (s)"], logprob_rows(
      repeats=args.repeats)))


if __name__ == "__main__":
  main()
