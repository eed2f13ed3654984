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
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import Array

from jaxcredit import estimators, forward, losses
from jaxcredit.rollout import Estimate, PolicyOutputs, Rollout
from jaxcredit.sampling import Actions, TreeSpec


@dataclasses.dataclass(frozen=True)
class CriticSettings:
  """The critic's value regression: PPO value clipping and the lambda-return targets.

  Attributes:
    clip: the value clip (`losses.value_loss`), or None.
    gamma: the targets' discount.
    lam: the targets' lambda.
  """

  clip: float | None = 0.2
  gamma: float = 1.0
  lam: float = 1.0


@dataclasses.dataclass(frozen=True)
class Settings:
  """Static settings of the learner step (hashable).

  Attributes:
    temperature: the sampling temperature log-probs are taken at.
    actions: the task's action restrictions.
    epochs: passes over the batch.
    minibatches: updates per pass.
    kl_reward_coef: the KL reward penalty's coefficient (0: none).
    kl_reward_kind: its `kl_penalty` estimator.
    recompute_old_logprobs: one forward pass for rollout.old_logprobs.
    critic: the critic's `CriticSettings`, or None without a critic.
    logits_per_chunk: float32 logits the log-prob head holds at a time.
    tree: the `TreeSpec` of tree rollouts (``fork="fixed"``): the policy's passes compute
      each shared prefix once (`forward.tree_forward`); None for independent rows.
    prompt_length: P, the prompt columns of the rollouts, with `tree`.
  """

  temperature: float = 1.0
  actions: Actions = Actions()
  epochs: int = 1
  minibatches: int = 1
  kl_reward_coef: float = 0.0
  kl_reward_kind: str = "k1"
  recompute_old_logprobs: bool = False  # one forward pass: rollout.old_logprobs
  critic: CriticSettings | None = None
  logits_per_chunk: int = forward.LOGITS_PER_CHUNK  # logits held at a time by the log-prob head
  tree: TreeSpec | None = None
  prompt_length: int = 0


def policy_outputs(model, rollout: Rollout, settings: Settings) -> PolicyOutputs:
  """`forward.policy_outputs` with the learner's settings: every pass of a policy over a
  rollout (the update's, the reference's, the recomputed old log-probs).

  Args:
    model: a `Transformer`.
    rollout: the `Rollout`.
    settings: the learner's `Settings`.

  Returns:
    its `PolicyOutputs`.
  """
  return forward.policy_outputs(model, rollout, settings.temperature, settings.actions,
                                settings.logits_per_chunk, tree=settings.tree,
                                prompt_length=settings.prompt_length)


def policy_update(model, optimizer, rollout: Rollout, estimate: Estimate, rl_step, objective,
                  settings: Settings) -> dict:
  """One optimizer step of the objective on a (mini)batch, in place. Traceable.

  Args:
    model: the policy.
    optimizer: its `nnx.Optimizer`.
    rollout: the (mini)batch.
    estimate: its advantage `Estimate`.
    rl_step: the step index passed to the objective (schedules).
    objective: ``objective(outputs, rollout, estimate, step) -> (loss, metrics)``
      (`losses.combine`).
    settings: the learner's `Settings` (`policy_outputs`).

  Returns:
    the objective's metrics and ``grad_norm``.
  """

  def loss_fn(model):
    return objective(policy_outputs(model, rollout, settings), rollout, estimate, rl_step)

  (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  optimizer.update(model, grads)
  return {**metrics, "grad_norm": optax.tree.norm(grads)}


def critic_update(critic, optimizer, rollout: Rollout, settings: CriticSettings,
                  actions: Actions) -> dict:
  """One clipped value-regression step (`losses.value_loss`) of a critic, in place, towards
  the lambda-returns of the rollout's token rewards, bootstrapped from rollout.values (the
  sampling-time values). Traceable.

  Args:
    critic: a `Transformer` with a value head.
    optimizer: its `nnx.Optimizer`.
    rollout: the (mini)batch, with values.
    settings: the `CriticSettings`.
    actions: the task's action restrictions.

  Returns:
    ``{"loss", ...value_loss metrics, "grad_norm"}``.
  """
  _, targets = estimators.gae(estimators.token_level_rewards(rollout), rollout.values, rollout.mask,
                              gamma=settings.gamma, lam=settings.lam)

  def loss_fn(critic):
    values = forward.critic_values(critic, rollout, actions)
    return losses.value_loss(values, rollout.values, targets, rollout.mask, clip=settings.clip)

  (loss, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(critic)
  optimizer.update(critic, grads)
  return {"loss": loss, **metrics, "grad_norm": optax.tree.norm(grads)}


def reference_logprobs(reference, rollout: Rollout, settings: Settings) -> Array:
  """Log-probs of the rollout's tokens under a frozen policy (the reference, or the policy
  itself before its updates), without gradient.

  Args:
    reference: a `Transformer`.
    rollout: the `Rollout`.
    settings: the learner's `Settings` (temperature, actions, head chunking).

  Returns:
    float32 ``[B, L]``, 0 off the mask.
  """
  return jax.lax.stop_gradient(policy_outputs(reference, rollout, settings).logprobs)


def prepare(models: dict, rollout: Rollout, settings: Settings) -> Rollout:
  """The rollout with what the updates read besides it. Traceable.

  Reference log-probs (kept if present); the policy's recomputed old_logprobs (with
  ``settings.recompute_old_logprobs``); the KL reward penalty as token_rewards
  (``kl_reward_coef > 0``); critic values (with a critic; kept if present, as a caller that
  already ran the critic on this batch sets them).

  Args:
    models: the learner's modules, ``{"model", "reference"[, "critic"]}``.
    rollout: the sampled `Rollout`.
    settings: the learner's `Settings`.

  Returns:
    the completed `Rollout`.
  """
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
  """Scalars describing the batch the updates learned from. Traceable.

  Args:
    rollout: the prepared `Rollout`.
    estimate: its advantage `Estimate`.

  Returns:
    reward_mean, kl (k3 to the reference), kl_reward_penalty, entropy, the sampler-learner
    mismatch (`mismatch_metrics`) with old log-probs, staleness_mean with staleness, and
    the scalar signal diagnostics (`estimators.signal_diagnostics`).
  """
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
  """The sampler-learner numerics gap on the sampled tokens (mu: sampler, pi: learner, the same
  parameters when the run is synchronous). Traceable.

  Args:
    behaviour_logprobs: ``[B, L]`` log mu.
    old_logprobs: ``[B, L]`` log pi, recomputed by the learner.
    mask: ``[B, L]`` the actions.

  Returns:
    ``mismatch/abs_logp_diff`` (mean ``|log pi - log mu|``), ``mismatch/k3`` (the k3
    estimate of KL(mu || pi)) and ``mismatch/max_ratio`` (the largest pi / mu, log-ratio
    bounded).
  """
  log_w = losses.behaviour_log_weight(old_logprobs, behaviour_logprobs, mask)
  valid = jnp.asarray(mask, bool)
  return {
      "mismatch/abs_logp_diff": losses.aggregate(jnp.abs(log_w), valid, "token-mean"),
      "mismatch/k3": losses.aggregate(jnp.expm1(log_w) - log_w, valid, "token-mean"),
      "mismatch/max_ratio": jnp.max(jnp.where(valid, jnp.exp(log_w), 0.0)),
  }


def minibatch_orders(rows: int, group_size: int, epochs: int, minibatches: int, seed: int,
                     rl_step: int) -> np.ndarray | None:
  """The row indices of every update: whole groups, in a random group order per epoch (NumPy,
  seeded by (seed, rl_step, epoch)).

  Args:
    rows: the batch's rows B.
    group_size: G (a minibatch holds whole groups).
    epochs: passes over the batch.
    minibatches: updates per pass.
    seed: the run's seed.
    rl_step: the step index.

  Returns:
    int ``[epochs * minibatches, rows / minibatches]``, or None for one minibatch (every
    update sees the whole batch).
  """
  if minibatches == 1:
    return None
  groups = rows // group_size
  orders = [np.random.default_rng([seed, rl_step, epoch]).permutation(groups)[:, None] * group_size
            + np.arange(group_size) for epoch in range(epochs)]
  return np.stack(orders).reshape(epochs * minibatches, -1)


def make_step(graphdef, *, advantage: Callable[[Rollout], Estimate], objective, settings: Settings,
              state_sharding=None):
  """The jitted learner step (module docstring).

  Args:
    graphdef: of the learner's modules dict (``nnx.split``).
    advantage: ``advantage(rollout) -> Estimate`` (`estimators.from_config`).
    objective: ``objective(outputs, rollout, estimate, step) -> (loss, metrics)``
      (`losses.from_config`).
    settings: the learner's static `Settings`.
    state_sharding: the state's shardings (``jax.tree.map(lambda x: x.sharding, state)``),
      which the updated state keeps; None leaves its placement to XLA's propagation, which may
      shard a parameter placed replicated, so that the next step's inputs differ and every
      program reading the parameters compiles again.

  Returns:
    ``learner_step(state, rollout, orders, rl_step) -> (state, metrics)``: orders from
    `minibatch_orders` (None for one minibatch), rl_step the step index passed to the
    objective; the metrics are the update metrics averaged over the updates plus
    `batch_metrics`.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from flax import nnx
    >>> from jaxcredit import estimators, losses, models
    >>> from jaxcredit.rollout import Rollout
    >>> from jaxcredit.train import learner
    >>> policy = models.Transformer(models.preset("tiny"), rngs=nnx.Rngs(0))
    >>> graphdef, state = nnx.split({
    ...     "model": policy, "reference": nnx.clone(policy),
    ...     "optimizer": nnx.Optimizer(policy, optax.adam(1e-3), wrt=nnx.Param)})
    >>> step = learner.make_step(
    ...     graphdef, advantage=estimators.from_config("grpo"),
    ...     objective=losses.from_config({"policy": {"name": "ppo_clip"}}),
    ...     settings=learner.Settings())
    >>> rollout = Rollout(tokens=jnp.ones((4, 6), jnp.int32),
    ...                   mask=jnp.zeros((4, 6), bool).at[:, 2:].set(True),
    ...                   rewards=jnp.array([1.0, 0.0, 1.0, 0.0]), group_size=2)
    >>> rollout = rollout.replace(behaviour_logprobs=learner.reference_logprobs(
    ...     policy, rollout, learner.Settings()))
    >>> state, metrics = step(state, rollout, None, 0)
    >>> float(metrics["reward_mean"]), float(metrics["policy/clipfrac"])
    (0.5, 0.0)
  """

  def update(state, rollout, estimate, rows, rl_step):
    models = nnx.merge(graphdef, state)
    if rows is not None:
      rollout, estimate = jax.tree.map(lambda x: x[rows], (rollout, estimate))
    metrics = policy_update(models["model"], models["optimizer"], rollout, estimate, rl_step,
                            objective, settings)
    if settings.critic is not None:
      critic = critic_update(models["critic"], models["critic_optimizer"], rollout, settings.critic,
                             settings.actions)
      metrics.update({f"critic/{k}": v for k, v in critic.items()})
    return nnx.state(models), metrics

  @functools.partial(jax.jit, out_shardings=(state_sharding, None))
  def learner_step(state, rollout: Rollout, orders, rl_step):
    rollout = prepare(nnx.merge(graphdef, state), rollout, settings)
    estimate = advantage(rollout)
    body = lambda state, rows: update(state, rollout, estimate, rows, rl_step)
    state, metrics = jax.lax.scan(body, state, orders,
                                  length=None if orders is not None else settings.epochs)
    metrics = jax.tree.map(lambda m: jnp.mean(m, axis=0), metrics)
    return state, {**metrics, **batch_metrics(rollout, estimate)}

  return learner_step
