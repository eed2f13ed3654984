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
from jaxcredit.losses import (covariance, off_policy, policy, preference, sequence_ratio,
                              trust_region, value)
from jaxcredit.losses.aggregation import aggregate
from jaxcredit.losses.kl import kl_penalty
from jaxcredit.registry import Registry
from jaxcredit.rollout import Estimate, MissingFields, PolicyOutputs, Rollout

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
  """The per-row mean of token advantages over valid tokens.

  For a broadcast sequence advantage (GRPO, RLOO) this recovers it exactly.

  Args:
    advantages: ``[B, T]`` per-token advantages.
    mask: ``[B, T]`` policy actions.

  Returns:
    float32 ``[B]``; 0 for a row without valid tokens.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.losses import registered
    >>> mask = jnp.array([[True, True, False]])
    >>> registered.sequence_advantages(jnp.array([[2.0, 2.0, 9.0]]), mask)
    Array([2.], dtype=float32)
  """
  return masked_mean(sanitise(advantages, as_bool(mask)), as_bool(mask), axis=1)


def _old_logprobs(rollout: Rollout, name: str) -> Array:
  """rollout.old_logprobs; a ValueError naming `name` when the learner did not recompute them
  (never a silent fallback to the behaviour log-probs, which would make w = 1)."""
  if rollout.old_logprobs is None:
    raise MissingFields(("old_logprobs",),
                        f"{name} needs rollout.old_logprobs, which is None: the learner "
                        "recomputes them before its updates when rl.recompute_old_logprobs = True.")
  return rollout.old_logprobs


def _proximal(rollout: Rollout, name: str) -> tuple[Array]:
  return (rollout.proximal_logprobs(by=name),)


def _proximal_and_behaviour(rollout: Rollout, name: str) -> tuple[Array, Array]:
  rollout.require("behaviour_logprobs", by=name)
  return _old_logprobs(rollout, name), rollout.behaviour_logprobs


def _register_token_loss(name: str, fn: Callable, logprobs=_proximal) -> None:
  """Registers fn(logp, *logprobs(rollout, name), advantages, mask, **hparams) under `name`:
  the current log-probs, then the anchors `logprobs` picks from the rollout."""

  def adapter(outputs, rollout, estimate, **hparams):
    return fn(outputs.logprobs, *logprobs(rollout, name), estimate.advantages, rollout.mask,
              **hparams)

  adapter.__doc__ = fn.__doc__
  register(name)(adapter)


for _name, _fn in {
    "ppo_clip": policy.ppo_clip_loss,
    "gspo_token": sequence_ratio.gspo_token_loss,
    "cispo": policy.cispo_loss,
    "gmpo": sequence_ratio.gmpo_loss,
    "sapo": policy.sapo_loss,
    "clip_cov": covariance.clip_cov_loss,
    "kl_cov": covariance.kl_cov_loss,
    "dppo": trust_region.dppo_loss,
}.items():
  _register_token_loss(_name, _fn)

for _name, _fn in {
    "tis": off_policy.tis_loss,
    "masked_is": off_policy.masked_is_loss,
    "m2po": off_policy.m2po_loss,
}.items():
  _register_token_loss(_name, _fn, _proximal_and_behaviour)


@register("opsm")
def _opsm(outputs, rollout, estimate, **hparams):
  rollout.require("behaviour_logprobs", by="opsm")
  return off_policy.opsm_loss(outputs.logprobs, rollout.proximal_logprobs(by="opsm"),
                              rollout.behaviour_logprobs, estimate.advantages, rollout.mask,
                              **hparams)


@register("decoupled_ppo")
def _decoupled_ppo(outputs, rollout, estimate, *, proximal: str = "recompute", **hparams):
  rollout.require("behaviour_logprobs", by="decoupled_ppo")
  if proximal == "loglinear":
    rollout.require("staleness", by="decoupled_ppo with proximal='loglinear'")
    old_logprobs = None
  else:
    old_logprobs = _old_logprobs(rollout, "decoupled_ppo")
  return trust_region.decoupled_ppo_loss(
      outputs.logprobs, old_logprobs, rollout.behaviour_logprobs, estimate.advantages,
      rollout.mask, staleness=rollout.staleness, proximal=proximal, **hparams)


@register("sat")
def _sat(outputs, rollout, estimate, **hparams):
  rollout.require("staleness", by="sat")
  return trust_region.sat_loss(outputs.logprobs, rollout.proximal_logprobs(by="sat"),
                             estimate.advantages, rollout.mask, rollout.staleness, **hparams)


@register("topr")
def _topr(outputs, rollout, estimate, **hparams):
  rollout.require("behaviour_logprobs", by="topr")
  return off_policy.topr_loss(outputs.logprobs, rollout.behaviour_logprobs, estimate.advantages,
                              rollout.mask, **hparams)


@register("pg")
def _pg(outputs, rollout, estimate, **hparams):
  """REINFORCE on the current log-probs (no ratio): -A_t log pi(a_t)."""
  return policy.pg_loss(outputs.logprobs, estimate.advantages, rollout.mask, **hparams)


@register("gspo")
def _gspo(outputs, rollout, estimate, **hparams):
  seq_advantages = sequence_advantages(estimate.advantages, rollout.mask)
  return sequence_ratio.gspo_loss(
      outputs.logprobs, rollout.proximal_logprobs(by="gspo"), seq_advantages, rollout.mask,
      **hparams
  )


@register("value")
def _value(outputs, rollout, estimate, **hparams):
  """Clipped value loss of outputs.values against estimate.returns, clipped
  around the rollout's values."""
  rollout.require("values", by="value")
  if outputs.values is None or estimate.returns is None:
    raise ValueError("value needs outputs.values and estimate.returns (e.g. from gae).")
  return value.value_loss(outputs.values, rollout.values, estimate.returns, rollout.mask, **hparams)


@register("entropy")
def _entropy(outputs, rollout, estimate, **hparams):
  """-aggregate(outputs.entropy): a bonus when added with a positive coefficient."""
  del estimate
  if outputs.entropy is None:
    raise ValueError("entropy needs outputs.entropy.")
  return value.entropy_bonus(outputs.entropy, rollout.mask, **hparams)


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


def _pair_sums(name: str, rollout: Rollout, logprobs: Array) -> tuple[Array, Array]:
  """Summed log-probs of (chosen, rejected): rows 2k and 2k + 1 (group_size == 2)."""
  if rollout.group_size != 2:
    raise ValueError(
        f"{name} needs pairs: group_size must be 2 (chosen, rejected), got {rollout.group_size}."
    )
  valid = as_bool(rollout.mask)
  sums = masked_sum(sanitise(logprobs, valid), valid, axis=1)
  return sums[0::2], sums[1::2]


def _register_reference_pair_loss(name: str, fn: Callable) -> None:
  """Registers fn(policy_chosen, policy_rejected, ref_chosen, ref_rejected, *, beta)
  over paired rows (see `_pair_sums`); needs rollout.ref_logprobs."""

  def adapter(outputs, rollout, estimate, *, beta: float = 0.1):
    del estimate
    rollout.require("ref_logprobs", by=name)
    policy_pair = _pair_sums(name, rollout, outputs.logprobs)
    ref_pair = _pair_sums(name, rollout, rollout.ref_logprobs)
    return fn(*policy_pair, *ref_pair, beta=beta)

  adapter.__doc__ = fn.__doc__
  register(name)(adapter)


_register_reference_pair_loss("dpo", preference.dpo_loss)
_register_reference_pair_loss("ipo", preference.ipo_loss)


@register("simpo")
def _simpo(outputs, rollout, estimate, *, beta: float = 2.0, gamma: float = 1.0):
  """Pairs as in dpo; lengths are the rows' valid-token counts; no reference."""
  del estimate
  lengths = jnp.sum(as_bool(rollout.mask), axis=1)
  return preference.simpo_loss(
      *_pair_sums("simpo", rollout, outputs.logprobs), lengths[0::2], lengths[1::2],
      beta=beta, gamma=gamma,
  )
