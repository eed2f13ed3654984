"""Teacher-forced passes of the policy and the critic over rollouts, and the SFT step.

The RL update lives in `jaxcredit.train.learner`; data loading, sampling,
rewards, logging and checkpoints stay outside both. Every pass applies the
task's `Actions` exactly as the sampler did, so on-policy ratios start at 1.
"""

import jax.numpy as jnp
from flax import nnx
from jax import Array

from jaxcredit import losses
from jaxcredit.logprobs import token_entropy, token_logprobs
from jaxcredit.rollout import PolicyOutputs, Rollout
from jaxcredit.sampling import Actions, mask_logits, prompt_positions


def shifted_logprobs(logits, tokens, temperature: float = 1.0, actions: Actions = Actions()):
  """[B, L] log-probs (and entropies) of tokens[:, t] under logits[:, t - 1]
  (restricted to actions.allowed[t]); 0 at t = 0."""
  logits = mask_logits(logits[:, :-1].astype(jnp.float32), actions.columns(1).allowed)
  logp = token_logprobs(logits, tokens[:, 1:], temperature=temperature)
  entropy = token_entropy(logits / temperature)
  pad = lambda x: jnp.pad(x, [(0, 0), (1, 0)])
  return pad(logp), pad(entropy)


def _forward(model, tokens, token_valid, positions, actions: Actions):
  """The model on [B, L] rows: every token valid and positions counted from 0 unless given."""
  token_valid = jnp.ones(tokens.shape, bool) if token_valid is None else token_valid
  positions = prompt_positions(token_valid) if positions is None else positions
  return model(actions.observe(tokens), positions=positions, token_valid=token_valid)


def policy_outputs(model, rollout: Rollout, temperature: float,
                   actions: Actions = Actions()) -> PolicyOutputs:
  """The current policy's log-probs, entropies (and values V(s_t), the value
  head's output at the state before action t) on a rollout's tokens."""
  out = _forward(model, rollout.tokens, rollout.token_valid, rollout.positions, actions)
  logp, entropy = shifted_logprobs(out.logits, rollout.tokens, temperature, actions)
  values = None if out.values is None else jnp.pad(out.values[:, :-1], [(0, 0), (1, 0)])
  return PolicyOutputs(logprobs=logp, entropy=entropy, values=values)


def sft_step(actions: Actions = Actions()):
  """A jitted cross-entropy step on the completion tokens (loss_mask) of [B, L] rows."""

  @nnx.jit
  def step(model, optimizer, tokens, loss_mask, token_valid):

    def loss_fn(model):
      out = _forward(model, tokens, token_valid, None, actions)
      logp, _ = shifted_logprobs(out.logits, tokens, actions=actions)
      return losses.aggregate(-logp, loss_mask, "token-mean")

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  return step


def critic_values(critic, rollout: Rollout, actions: Actions = Actions()) -> Array:
  """[B, L] critic values V(s_t) at action positions (0 elsewhere)."""
  out = _forward(critic, rollout.tokens, rollout.token_valid, rollout.positions, actions)
  values = jnp.pad(out.values[:, :-1], [(0, 0), (1, 0)])
  return jnp.where(rollout.mask, values, 0.0)
