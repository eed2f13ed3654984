"""The learner: one jitted pure function from (state, rollout) to (state, metrics).

  step = learner.make_step(graphdef, advantage=..., objective=..., settings=...)
  state, metrics = step(state, rollout, orders, rl_step)

`state` is the nnx.State of the learner's modules, `{"model", "optimizer",
"reference"}` plus `{"critic", "critic_optimizer"}` when a critic is trained
(`nnx.split` of that dict gives `graphdef` and `state`). One call:

  1. log-probs of the rollout under the frozen reference (unless the rollout
     already has them), with settings.recompute_old_logprobs the policy's own
     log-probs before its updates (rollout.old_logprobs, the proximal policy),
     the per-token KL reward penalty
     r_t -= coef * KL_t (settings.kl_reward_coef > 0) and critic values V(s_t);
  2. the advantage estimate, `advantage(rollout)`;
  3. `epochs x minibatches` updates under `lax.scan`: the policy on
     `objective`, then (with a critic) the clipped value regression towards
     lambda-returns, each on the rows `orders[u]` (whole groups);
  4. metrics: the update metrics averaged over all updates (`critic/...` for
     the critic), and batch metrics of the rollout (reward mean, entropy, KL
     to the reference, the KL penalty, signal diagnostics, and the sampler-learner
     mismatch `mismatch/...` when old_logprobs were recomputed).
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import Array

from jaxcredit import estimators, forward, losses
from jaxcredit.rollout import Estimate, Rollout
from jaxcredit.sampling import Actions


@dataclasses.dataclass(frozen=True)
class CriticSettings:
  """The critic's value regression: PPO value clipping and the lambda-return targets."""

  clip: float | None = 0.2
  gamma: float = 1.0
  lam: float = 1.0


@dataclasses.dataclass(frozen=True)
class Settings:
  """Static settings of the learner step (hashable)."""

  temperature: float = 1.0
  actions: Actions = Actions()
  epochs: int = 1
  minibatches: int = 1
  kl_reward_coef: float = 0.0
  kl_reward_kind: str = "k1"
  recompute_old_logprobs: bool = False  # one forward pass: rollout.old_logprobs
  critic: CriticSettings | None = None
  logits_per_chunk: int = forward.LOGITS_PER_CHUNK  # logits held at a time by the log-prob head


def policy_update(model, optimizer, rollout: Rollout, estimate: Estimate, rl_step, objective,
                  temperature: float, actions: Actions, logits_per_chunk: int) -> dict:
  """One optimizer step of `objective` (losses.combine) on a (mini)batch; its metrics and the
  grad norm."""

  def loss_fn(model):
    return objective(forward.policy_outputs(model, rollout, temperature, actions, logits_per_chunk),
                     rollout, estimate, rl_step)

  (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  optimizer.update(model, grads)
  return {**metrics, "grad_norm": optax.tree.norm(grads)}


def critic_update(critic, optimizer, rollout: Rollout, settings: CriticSettings,
                  actions: Actions) -> dict:
  """One clipped value-regression step (losses.value_loss) of a critic towards
  the lambda-returns of the rollout's token rewards, bootstrapped from
  rollout.values (the sampling-time values)."""
  _, targets = estimators.gae(estimators.token_level_rewards(rollout), rollout.values, rollout.mask,
                              gamma=settings.gamma, lam=settings.lam)

  def loss_fn(critic):
    values = forward.critic_values(critic, rollout, actions)
    return losses.value_loss(values, rollout.values, targets, rollout.mask, clip=settings.clip)

  (loss, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(critic)
  optimizer.update(critic, grads)
  return {"loss": loss, **metrics, "grad_norm": optax.tree.norm(grads)}


def reference_logprobs(reference, rollout: Rollout, settings: Settings) -> Array:
  """[B, L] log-probs of the rollout's tokens under a frozen policy (the reference, or the
  policy itself before its updates)."""
  return jax.lax.stop_gradient(forward.policy_outputs(
      reference, rollout, settings.temperature, settings.actions,
      settings.logits_per_chunk).logprobs)


def prepare(models: dict, rollout: Rollout, settings: Settings) -> Rollout:
  """The rollout with reference log-probs (kept if present), the policy's recomputed
  old_logprobs (recompute_old_logprobs), the KL reward penalty as token_rewards
  (kl_reward_coef > 0) and critic values (with a critic; kept if present, as a caller that
  already ran the critic on this batch sets them)."""
  if rollout.ref_logprobs is None:
    rollout = rollout.replace(
        ref_logprobs=reference_logprobs(models["reference"], rollout, settings))
  if settings.recompute_old_logprobs:
    rollout = rollout.replace(old_logprobs=reference_logprobs(models["model"], rollout, settings))
  if settings.kl_reward_coef:
    rollout = rollout.replace(token_rewards=losses.kl_reward_shaping(
        jnp.zeros(rollout.mask.shape), rollout.behaviour_logprobs, rollout.ref_logprobs,
        rollout.mask,
        coef=settings.kl_reward_coef, kind=settings.kl_reward_kind))
  if settings.critic is not None and rollout.values is None:
    rollout = rollout.replace(
        values=forward.critic_values(models["critic"], rollout, settings.actions))
  return rollout


def batch_metrics(rollout: Rollout, estimate: Estimate) -> dict:
  """Scalars describing the batch the updates learned from."""
  metrics = {
      "reward_mean": jnp.mean(rollout.rewards),
      "kl": losses.aggregate(
          losses.kl_penalty(rollout.behaviour_logprobs, rollout.ref_logprobs, kind="k3"),
          rollout.mask, "token-mean"),
      "kl_reward_penalty": 0.0 if rollout.token_rewards is None else -losses.aggregate(
          rollout.token_rewards, rollout.mask, "token-mean"),
  }
  if rollout.entropy is not None:
    metrics["entropy"] = losses.aggregate(rollout.entropy, rollout.mask, "token-mean")
  if rollout.old_logprobs is not None and rollout.behaviour_logprobs is not None:
    metrics.update(mismatch_metrics(rollout.behaviour_logprobs, rollout.old_logprobs,
                                    rollout.mask))
  if rollout.staleness is not None:
    metrics["staleness_mean"] = jnp.mean(rollout.staleness.astype(jnp.float32))
  diagnostics = estimators.signal_diagnostics(rollout.rewards, estimate.advantages, rollout.mask,
                                              group_size=rollout.group_size)
  return {**metrics, **{k: v for k, v in diagnostics.items() if jnp.ndim(v) == 0}}


def mismatch_metrics(behaviour_logprobs: Array, old_logprobs: Array, mask: Array) -> dict:
  """The sampler-learner numerics gap on the sampled tokens (mu: sampler, pi: learner,
  the same parameters when the run is synchronous): mean |log pi - log mu|, the k3
  estimate of KL(mu || pi) and the largest ratio pi / mu (log-ratio bounded)."""
  log_w = losses.behaviour_log_weight(old_logprobs, behaviour_logprobs, mask)
  valid = jnp.asarray(mask, bool)
  return {
      "mismatch/abs_logp_diff": losses.aggregate(jnp.abs(log_w), valid, "token-mean"),
      "mismatch/k3": losses.aggregate(jnp.expm1(log_w) - log_w, valid, "token-mean"),
      "mismatch/max_ratio": jnp.max(jnp.where(valid, jnp.exp(log_w), 0.0)),
  }


def minibatch_orders(rows: int, group_size: int, epochs: int, minibatches: int, seed: int,
                     rl_step: int) -> np.ndarray | None:
  """[epochs * minibatches, rows / minibatches] row indices of every update:
  whole groups, in a random group order per epoch (numpy, seeded by (seed,
  rl_step, epoch)); None when there is one minibatch (every update sees the
  whole batch)."""
  if minibatches == 1:
    return None
  groups = rows // group_size
  orders = [np.random.default_rng([seed, rl_step, epoch]).permutation(groups)[:, None] * group_size
            + np.arange(group_size) for epoch in range(epochs)]
  return np.stack(orders).reshape(epochs * minibatches, -1)


def make_step(graphdef, *, advantage: Callable[[Rollout], Estimate], objective, settings: Settings):
  """The jitted learner step `(state, rollout, orders, rl_step) -> (state, metrics)`
  (module docstring). orders: `minibatch_orders(...)`, or None for one
  minibatch; rl_step: the step index passed to the objective (schedules)."""

  def update(state, rollout, estimate, rows, rl_step):
    models = nnx.merge(graphdef, state)
    if rows is not None:
      rollout, estimate = jax.tree.map(lambda x: x[rows], (rollout, estimate))
    metrics = policy_update(models["model"], models["optimizer"], rollout, estimate, rl_step,
                            objective, settings.temperature, settings.actions,
                            settings.logits_per_chunk)
    if settings.critic is not None:
      critic = critic_update(models["critic"], models["critic_optimizer"], rollout, settings.critic,
                             settings.actions)
      metrics.update({f"critic/{k}": v for k, v in critic.items()})
    return nnx.state(models), metrics

  @jax.jit
  def learner_step(state, rollout: Rollout, orders, rl_step):
    rollout = prepare(nnx.merge(graphdef, state), rollout, settings)
    estimate = advantage(rollout)
    body = lambda state, rows: update(state, rollout, estimate, rows, rl_step)
    state, metrics = jax.lax.scan(body, state, orders,
                                  length=None if orders is not None else settings.epochs)
    metrics = jax.tree.map(lambda m: jnp.mean(m, axis=0), metrics)
    return state, {**metrics, **batch_metrics(rollout, estimate)}

  return learner_step
