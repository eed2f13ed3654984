"""Teacher-forced passes of the policy and the critic over rollouts, and the SFT step.

The RL update lives in `jaxcredit.train.learner`; data loading, sampling,
rewards, logging and checkpoints stay outside both.
"""

from typing import NamedTuple

import jax.numpy as jnp
from flax import nnx
from jax import Array

from jaxcredit import losses
from jaxcredit.logprobs import token_entropy, token_logprobs
from jaxcredit.rollout import PolicyOutputs, Rollout
from jaxcredit.sampling.sampler import mask_logits, observed_inputs


class Actions(NamedTuple):
  """A task's action constraints over whole [L] rows (prompt then response):
  allowed [L, V] bool (None: every action), hidden [L] bool (None: the model
  sees every token; else hidden tokens are fed as `hidden_token`)."""

  allowed: Array | None = None
  hidden: Array | None = None
  hidden_token: int = 0


def shifted_logprobs(logits, tokens, temperature: float = 1.0, allowed: Array | None = None):
  """[B, L] log-probs (and entropies) of tokens[:, t] under logits[:, t - 1]
  (restricted to allowed[t]); 0 at t = 0."""
  logits = mask_logits(logits[:, :-1].astype(jnp.float32), None if allowed is None else allowed[1:])
  logp = token_logprobs(logits, tokens[:, 1:], temperature=temperature)
  entropy = token_entropy(logits / temperature)
  pad = lambda x: jnp.pad(x, [(0, 0), (1, 0)])
  return pad(logp), pad(entropy)


def _forward(model, tokens, positions, token_valid, actions: Actions):
  inputs = observed_inputs(tokens, actions.hidden, actions.hidden_token)
  return model(inputs, positions=positions, token_valid=token_valid)


def policy_outputs(model, rollout: Rollout, temperature: float, actions: Actions = Actions()) -> PolicyOutputs:
  """The current policy's log-probs, entropies (and values V(s_t), the value
  head's output at the state before action t) on a rollout's tokens."""
  out = _forward(model, rollout.tokens, rollout.extras["positions"], rollout.extras["token_valid"], actions)
  logp, entropy = shifted_logprobs(out.logits, rollout.tokens, temperature, actions.allowed)
  values = None if out.values is None else jnp.pad(out.values[:, :-1], [(0, 0), (1, 0)])
  return PolicyOutputs(logprobs=logp, entropy=entropy, values=values)


def sft_step(actions: Actions = Actions()):
  """A jitted cross-entropy step on the completion tokens (loss_mask) of [B, L] rows."""

  @nnx.jit
  def step(model, optimizer, tokens, loss_mask, token_valid):
    positions = jnp.maximum(jnp.cumsum(token_valid, axis=1) - 1, 0)

    def loss_fn(model):
      out = _forward(model, tokens, positions, token_valid, actions)
      logp, _ = shifted_logprobs(out.logits, tokens, allowed=actions.allowed)
      return losses.aggregate(-logp, loss_mask, "token-mean")

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  return step


def critic_values(critic, rollout: Rollout, actions: Actions = Actions()) -> Array:
  """[B, L] critic values V(s_t) at action positions (0 elsewhere)."""
  out = _forward(critic, rollout.tokens, rollout.extras["positions"], rollout.extras["token_valid"], actions)
  values = jnp.pad(out.values[:, :-1], [(0, 0), (1, 0)])
  return jnp.where(rollout.mask, values, 0.0)
