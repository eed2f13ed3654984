"""Registry adapters: every estimator as `fn(rollout, **hparams) -> Estimate`."""

import functools
from collections.abc import Callable

import jax.numpy as jnp

from jaxcredit._masking import as_bool
from jaxcredit.estimators import group, returns
from jaxcredit.registry import Registry
from jaxcredit.rollout import Estimate, Rollout

EstimatorFn = Callable[..., Estimate]


def _adapt(name: str, fn: Callable) -> EstimatorFn:
  """Validates the rollout and accepts a bare [B, T] array as the advantages."""

  @functools.wraps(fn)
  def estimator(rollout: Rollout, **hparams) -> Estimate:
    out = fn(rollout.check(), **hparams)
    return out if isinstance(out, Estimate) else Estimate(advantages=out)

  return estimator


REGISTRY: Registry[EstimatorFn] = Registry("estimator", wrap=_adapt)
register = REGISTRY.register
get = REGISTRY.get
names = REGISTRY.names


def token_level_rewards(rollout: Rollout) -> jnp.ndarray:
  """Outcome reward on the last action plus any dense `token_rewards`; [B, T]."""
  rewards = group.outcome_to_tokens(rollout.rewards, rollout.mask)
  if rollout.token_rewards is not None:
    rewards += jnp.where(as_bool(rollout.mask), rollout.token_rewards, 0.0)
  return rewards


@register("grpo")
def _grpo(rollout: Rollout, *, eps: float = 1e-6, scale_by_std: bool = True):
  seq = group.grpo_advantages(
      rollout.rewards, group_size=rollout.group_size, eps=eps, scale_by_std=scale_by_std
  )
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("dr_grpo")
def _dr_grpo(rollout: Rollout):
  return _grpo(rollout, scale_by_std=False)


@register("rloo")
def _rloo(rollout: Rollout):
  seq = group.rloo_advantages(rollout.rewards, group_size=rollout.group_size)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("reinforce")
def _reinforce(rollout: Rollout, *, gamma: float = 1.0):
  ret = returns.discounted_returns(token_level_rewards(rollout), rollout.mask, gamma=gamma)
  return Estimate(advantages=ret, returns=ret)


@register("gae")
def _gae(rollout: Rollout, *, gamma: float = 1.0, lam: float = 0.95, method: str = "scan"):
  rollout.require("values", by="gae")
  advantages, rets = returns.gae(
      token_level_rewards(rollout), rollout.values, rollout.mask,
      gamma=gamma, lam=lam, method=method,
  )
  return Estimate(advantages=advantages, returns=rets)
