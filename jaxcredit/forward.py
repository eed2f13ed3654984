"""Teacher-forced passes of the policy and the critic over rollouts, and the SFT step.

The RL update lives in `jaxcredit.train.learner`; data loading, sampling,
rewards, logging and checkpoints stay outside both. Every pass applies the
task's `Actions` exactly as the sampler did, so on-policy ratios start at 1.
"""

import functools

import jax.numpy as jnp
from flax import nnx
from jax import Array

from jaxcredit import losses
from jaxcredit.logprobs import chunked_token_logprobs, chunked_token_logprobs_and_entropy
from jaxcredit.models import context_parallel, sharding
from jaxcredit.rollout import PolicyOutputs, Rollout
from jaxcredit.models.transformer import KVCache
from jaxcredit.sampling import Actions, TreeSpec, prompt_positions


LOGITS_PER_CHUNK = 2**26
"""float32 logits the log-prob head holds at a time (256 MiB): 441 tokens at
V = 152k, the whole batch at once for a small vocabulary."""


def shifted_logprobs(model, hidden, tokens, temperature: float = 1.0, actions: Actions = Actions(),
                     *, logits_per_chunk: int = LOGITS_PER_CHUNK, entropy: bool = True,
                     scored: Array | None = None):
  """Log-probs (and entropies) of each token under the model's head at the position before it.

  ``tokens[:, t]`` is scored by the head at ``hidden[:, t - 1]``, restricted to
  ``actions.allowed[t]``; position 0 gets 0. Through `chunked_token_logprobs_and_entropy`
  with the unembedding as stored (a tied embedding in place): the time axis is cut into
  chunks of ``max(1, logits_per_chunk // (B * V))`` positions, so ``[B, L, V]`` logits never
  exist. The head is token-local, so under a `sequence` mesh axis each device scores its own
  slice (`context_parallel.over_sequence`).

  Args:
    model: a `jaxcredit.models.Transformer`.
    hidden: ``[B, L, D]`` its hidden states on `tokens`.
    tokens: ``[B, L]`` int.
    temperature: the sampling temperature, > 0.
    actions: the task's action restrictions.
    logits_per_chunk: float32 logits the head holds at a time.
    entropy: also compute the entropies.
    scored: None (every token) or ``[B, L]`` bool, the tokens whose results are needed (a
      loss's action mask); the others get 0 and cost no logits.

  Returns:
    ``(logprobs, entropy)``, float32 ``[B, L]`` each; entropy is None when `entropy` is
    False.
  """
  batch, length = tokens.shape
  unembed, vocab_major = model.unembedding
  local_length = -(-length // context_parallel.sequence_shards())
  chunk = max(1, min(local_length, logits_per_chunk // (batch * model.config.vocab_size)))
  allowed = actions.allowed
  next_tokens = jnp.pad(tokens[:, 1:], [(0, 0), (0, 1)])
  where = None if scored is None else jnp.pad(jnp.asarray(scored, bool)[:, 1:], [(0, 0), (0, 1)])
  per_column = actions.per_column  # else None or one [V] set for every column
  if per_column:  # [L, V] or [B, L, V]: the row of the token scored at t
    end = [(0, 0)] * (allowed.ndim - 2) + [(0, 1), (0, 0)]
    allowed = jnp.pad(allowed[..., 1:, :], end, constant_values=True)
  head = functools.partial(
      chunked_token_logprobs_and_entropy if entropy else chunked_token_logprobs,
      chunk_size=chunk, temperature=temperature, vocab_major=vocab_major,
      row_blocks=sharding.batch_shards(batch))
  scores = context_parallel.over_sequence(
      lambda h, n, a, w, u: head(h, u, n, allowed=a, where=w),
      in_axes=(1, 1, allowed.ndim - 2 if per_column else None, None if where is None else 1,
               None))
  out = scores(hidden, next_tokens, allowed, where, unembed)
  shift = lambda x: jnp.pad(x[:, :-1], [(0, 0), (1, 0)])
  return (shift(out[0]), shift(out[1])) if entropy else (shift(out), None)


def _forward(model, tokens, token_valid, positions, actions: Actions):
  """The model's hidden states (no logits) on [B, L] rows: every token valid and
  positions counted from 0 unless given."""
  token_valid = jnp.ones(tokens.shape, bool) if token_valid is None else token_valid
  positions = prompt_positions(token_valid) if positions is None else positions
  return model(actions.observe(tokens), positions=positions, token_valid=token_valid, logits=False)


def policy_outputs(model, rollout: Rollout, temperature: float, actions: Actions = Actions(),
                   logits_per_chunk: int = LOGITS_PER_CHUNK, *, tree: TreeSpec | None = None,
                   prompt_length: int = 0) -> PolicyOutputs:
  """The current policy's log-probs, entropies and values on a rollout's tokens.

  Args:
    model: a `jaxcredit.models.Transformer` (with a value head for values).
    rollout: the `Rollout` to score.
    temperature: the sampling temperature, > 0.
    actions: the task's action restrictions, as the sampler applied them.
    logits_per_chunk: float32 logits the head holds at a time.
    tree: the `TreeSpec` of a ``fork="fixed"`` tree rollout (whole trees in `sample_tree`'s
      layout, positions and token_valid set): each shared prefix is computed once
      (`tree_forward`), with the same results; None computes every row.
    prompt_length: P, the prompt columns, with `tree`.

  Returns:
    `PolicyOutputs` of ``[B, L]`` arrays: log-probs and entropies at the action tokens
    (``rollout.mask``), 0 elsewhere; values V(s_t), the value head's output at the state
    before action t, or None without a value head.
  """
  if tree is None:
    out = _forward(model, rollout.tokens, rollout.token_valid, rollout.positions, actions)
    hidden, values = out.hidden, out.values
  else:
    rollout.require("positions", "token_valid", by="policy_outputs(tree=...)")
    hidden, values = tree_forward(model, rollout.tokens, rollout.token_valid, rollout.positions,
                                  tree, prompt_length, actions)
  logp, entropy = shifted_logprobs(model, hidden, rollout.tokens, temperature, actions,
                                   logits_per_chunk=logits_per_chunk, scored=rollout.mask)
  values = None if values is None else jnp.pad(values[:, :-1], [(0, 0), (1, 0)])
  return PolicyOutputs(logprobs=logp, entropy=entropy, values=values)


def tree_forward(model, tokens: Array, token_valid: Array, positions: Array, tree: TreeSpec,
                 prompt_length: int, actions: Actions = Actions()):
  """The model's hidden states (and values) on the rows of `sample_tree`'s layout, each shared
  prefix computed once.

  Row b's segment d is shared by the block of ``branching^(D - d)`` rows it heads, its prompt
  by the G leaves of the tree. The prompt runs once per tree; then, level by level, each
  node's KV cache rows are copied to its children (a gather, whose gradient sums the
  children's) and segment d runs once per node at its columns, the way `sample_tree`
  sampled it. Each token is computed once per node rather than once per
  row, and the result equals the forward pass over the unrolled rows (up to float
  summation order).

  Args:
    model: a `jaxcredit.models.Transformer`.
    tokens: ``[B, P + N]`` int, the leaves of whole trees (B a multiple of `tree.leaves`).
    token_valid: ``[B, P + N]`` bool.
    positions: ``[B, P + N]`` int RoPE positions.
    tree: the `TreeSpec` the rows were sampled with.
    prompt_length: P.
    actions: the task's action restrictions (hidden columns fed as `hidden_token`).

  Returns:
    ``(hidden [B, P + N, D], values [B, P + N] or None)``.

  Raises:
    ValueError: when B is not a multiple of the tree's leaves or the columns are not
      P + the tree's response budget.
  """
  batch, length = tokens.shape
  if batch % tree.leaves or length - prompt_length - tree.depth * tree.segment_tokens < 1:
    raise ValueError(f"tree_forward needs whole trees of {tree.leaves} leaves over P + N "
                     f"columns (P = {prompt_length}, N > {tree.depth} x "
                     f"{tree.segment_tokens}), got tokens of shape {[batch, length]}.")
  # Stages: the prompt (shared by a prompt's G leaves), then each level's segments; a stage's
  # cache rows are copied `fork` times into the next's.
  stages, begin = [(0, prompt_length, tree.leaves, 1)], prompt_length
  for level, width in enumerate(tree.budgets(length - prompt_length)):
    fork = tree.roots if level == 0 else tree.branching
    stages.append((begin, begin + width, tree.branching ** (tree.depth - level), fork))
    begin += width
  inputs = actions.observe(tokens)
  cache = KVCache.zeros(model.config, batch // tree.leaves, length)
  hidden, values = [], []
  for begin, end, block, fork in stages:
    if fork > 1:  # each row's children, contiguous
      cache = cache.rows(jnp.repeat(jnp.arange(cache.key_valid.shape[0]), fork))
    out, cache = model.decode(inputs[::block, begin:end], positions[::block, begin:end],
                              token_valid[::block, begin:end], cache, begin, logits=False)
    hidden.append(jnp.repeat(out.hidden, block, axis=0))
    values.append(None if out.values is None else jnp.repeat(out.values, block, axis=0))
  return (jnp.concatenate(hidden, axis=1),
          None if values[0] is None else jnp.concatenate(values, axis=1))


def sft_loss(model, tokens, loss_mask, token_valid=None, actions: Actions = Actions(),
             logits_per_chunk: int = LOGITS_PER_CHUNK) -> Array:
  """The mean negative log-likelihood of the completion tokens (token-mean). Traceable.

  Args:
    model: a `jaxcredit.models.Transformer`.
    tokens: ``[B, L]`` int, prompts and completions.
    loss_mask: ``[B, L]`` bool, the completion tokens.
    token_valid: ``[B, L]`` bool, the real tokens; None for all.
    actions: the task's action restrictions.
    logits_per_chunk: float32 logits the head holds at a time.

  Returns:
    float32 scalar.
  """
  out = _forward(model, tokens, token_valid, None, actions)
  logp, _ = shifted_logprobs(model, out.hidden, tokens, actions=actions,
                             logits_per_chunk=logits_per_chunk, entropy=False, scored=loss_mask)
  return losses.aggregate(-logp, loss_mask, "token-mean")


def sft_step(actions: Actions = Actions(), logits_per_chunk: int = LOGITS_PER_CHUNK):
  """A jitted cross-entropy step (`sft_loss`) on the completion tokens of ``[B, L]`` rows.

  Args:
    actions: the task's action restrictions.
    logits_per_chunk: float32 logits the head holds at a time.

  Returns:
    ``step(model, optimizer, tokens, loss_mask, token_valid) -> loss``, which updates the
    model and its `nnx.Optimizer` in place, keeping their shardings (`sharding.jit_in_place`).
  """

  def sft_update(model, optimizer, tokens, loss_mask, token_valid):
    loss, grads = nnx.value_and_grad(sft_loss)(model, tokens, loss_mask, token_valid, actions,
                                               logits_per_chunk)
    optimizer.update(model, grads)
    return loss

  return sharding.jit_in_place(sft_update)


def critic_values(critic, rollout: Rollout, actions: Actions = Actions()) -> Array:
  """Critic values V(s_t) at the action positions.

  Args:
    critic: a `jaxcredit.models.Transformer` with a value head.
    rollout: the `Rollout` to score.
    actions: the task's action restrictions.

  Returns:
    float32 ``[B, L]``, 0 off ``rollout.mask``.
  """
  out = _forward(critic, rollout.tokens, rollout.token_valid, rollout.positions, actions)
  values = jnp.pad(out.values[:, :-1], [(0, 0), (1, 0)])
  return jnp.where(rollout.mask, values, 0.0)
