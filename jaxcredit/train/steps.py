"""Jitted training steps: teacher-forced log-probs, the SFT step and the RL step.

The steps are pure functions of (model, optimizer state, batch); data loading,
sampling, rewards, logging and checkpoints stay outside them.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcredit.logprobs import token_entropy, token_logprobs
from jaxcredit.losses import aggregate
from jaxcredit.rollout import Estimate, PolicyOutputs, Rollout


def shifted_logprobs(logits, tokens, temperature: float = 1.0):
  """[B, T] log-probs (and entropies) of tokens[:, t] under logits[:, t - 1]; 0 at t = 0."""
  logp = token_logprobs(logits[:, :-1], tokens[:, 1:], temperature=temperature)
  entropy = token_entropy(logits[:, :-1].astype(jnp.float32) / temperature)
  pad = lambda x: jnp.pad(x, [(0, 0), (1, 0)])
  return pad(logp), pad(entropy)


def policy_outputs(model, rollout: Rollout, temperature: float) -> PolicyOutputs:
  """The current policy's log-probs, entropies (and values) on a rollout's tokens."""
  out = model(rollout.tokens, positions=rollout.extras["positions"],
              token_valid=rollout.extras["token_valid"])
  logp, entropy = shifted_logprobs(out.logits, rollout.tokens, temperature)
  values = None if out.values is None else jnp.pad(out.values[:, :-1], [(0, 0), (1, 0)])
  return PolicyOutputs(logprobs=logp, entropy=entropy, values=values)


@nnx.jit
def sft_step(model, optimizer, tokens, loss_mask, token_valid):
  """One cross-entropy step on the completion tokens (loss_mask) of [B, T] sequences."""
  positions = jnp.maximum(jnp.cumsum(token_valid, axis=1) - 1, 0)

  def loss_fn(model):
    out = model(tokens, positions=positions, token_valid=token_valid)
    logp, _ = shifted_logprobs(out.logits, tokens)
    return aggregate(-logp, loss_mask, "token-mean")

  loss, grads = nnx.value_and_grad(loss_fn)(model)
  optimizer.update(model, grads)
  return loss


def rl_step(objective, temperature: float):
  """A jitted update of `objective` (see losses.combine) on one (mini)batch."""

  @nnx.jit
  def step(model, optimizer, rollout: Rollout, estimate: Estimate, step_index):
    def loss_fn(model):
      outputs = policy_outputs(model, rollout, temperature)
      return objective(outputs, rollout, estimate, step_index)

    (loss, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    metrics["grad_norm"] = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads)))
    return metrics

  return step
