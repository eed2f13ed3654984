"""Registry adapters: every loss as `fn(outputs, rollout, estimate, **hparams)`.

outputs:  PolicyOutputs of the policy being trained on rollout.tokens.
rollout:  the sampled batch (behaviour/reference log-probs, mask, rewards).
estimate: the Estimate of an advantage estimator on that rollout.
Returns (scalar loss, metrics dict of scalars).
"""

import functools
from collections.abc import Callable

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, masked_mean, masked_sum, sanitise
from jaxcredit.losses.aggregation import aggregate
from jaxcredit.losses.kl import kl_penalty
from jaxcredit.losses.policy import gspo_loss, ppo_clip_loss
from jaxcredit.losses.preference import dpo_loss
from jaxcredit.registry import Registry
from jaxcredit.rollout import Estimate, PolicyOutputs, Rollout

LossFn = Callable[..., tuple[Array, dict[str, Array]]]


def _adapt(name: str, fn: Callable) -> LossFn:
  """Validates that outputs, rollout and estimate describe the same [B, T] batch."""

  @functools.wraps(fn)
  def loss(outputs: PolicyOutputs, rollout: Rollout, estimate: Estimate, **hparams):
    rollout.check()
    _checks.check_same_shape(
        tokens=rollout.tokens, **{f"outputs.{k}": v for k, v in outputs._asdict().items()},
        advantages=estimate.advantages,
    )
    return fn(outputs, rollout, estimate, **hparams)

  return loss


REGISTRY: Registry[LossFn] = Registry("loss", wrap=_adapt)
register = REGISTRY.register
get = REGISTRY.get
names = REGISTRY.names


def sequence_advantages(advantages: Array, mask: Array) -> Array:
  """Per-row mean of token advantages over valid tokens, [B, T] -> [B].

  For a broadcast sequence advantage (GRPO, RLOO) this recovers it exactly.
  """
  return masked_mean(sanitise(advantages, as_bool(mask)), as_bool(mask), axis=1)


@register("ppo_clip")
def _ppo_clip(outputs, rollout, estimate, **hparams):
  rollout.require("logprobs", by="ppo_clip")
  return ppo_clip_loss(
      outputs.logprobs, rollout.logprobs, estimate.advantages, rollout.mask, **hparams
  )


@register("gspo")
def _gspo(outputs, rollout, estimate, **hparams):
  rollout.require("logprobs", by="gspo")
  seq_advantages = sequence_advantages(estimate.advantages, rollout.mask)
  return gspo_loss(outputs.logprobs, rollout.logprobs, seq_advantages, rollout.mask, **hparams)


@register("kl")
def _kl(outputs, rollout, estimate, *, kind: str = "k3", aggregation: str = "token-mean"):
  """KL(pi || ref) estimate on the sampled tokens, aggregated."""
  del estimate
  rollout.require("ref_logprobs", by="kl")
  valid = as_bool(rollout.mask)
  kl_tok = kl_penalty(
      sanitise(outputs.logprobs, valid), sanitise(rollout.ref_logprobs, valid), kind=kind
  )
  value = aggregate(kl_tok, valid, aggregation)
  return value, {"kl": value}


@register("dpo")
def _dpo(outputs, rollout, estimate, *, beta: float = 0.1):
  """Rows come in pairs (group_size == 2): row 2k is chosen, row 2k + 1 rejected."""
  del estimate
  rollout.require("ref_logprobs", by="dpo")
  if rollout.group_size != 2:
    raise ValueError(
        f"dpo needs pairs: group_size must be 2 (chosen, rejected), got {rollout.group_size}."
    )
  valid = as_bool(rollout.mask)
  policy = masked_sum(sanitise(outputs.logprobs, valid), valid, axis=1)
  ref = masked_sum(sanitise(rollout.ref_logprobs, valid), valid, axis=1)
  return dpo_loss(policy[0::2], policy[1::2], ref[0::2], ref[1::2], beta=beta)
