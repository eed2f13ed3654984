"""Policy gradients as the lab measures them, all traceable: an objective's gradient on a
batch and on each of its groups, the true gradient of J in closed form, and how noisy a
set of gradient estimates is against it.

  policy_gradient(objective, model, batch, advantages, actions)   a batch's gradient
  success_gradient(model, config, prompts, targets)   J and the true gradient of J
  group_gradients(objective, model, batch, advantages, actions)   one gradient per group
  gradient_noise(ascents, true_gradient)          noise scale and cosine to the true gradient
  zero_variance_probability(model, config, prompts, targets, G)   a group without signal
"""

import jax
import jax.flatten_util
import jax.numpy as jnp
from flax import nnx

from jaxcredit import forward
from jaxcredit.rollout import Estimate, Rollout
from jaxcredit.sampling import Actions
from jaxcredit.tasks import key_token, procedural

def policy_gradient(objective, model, batch: Rollout, advantages, actions: Actions):
  """The objective's gradient on a batch for given token advantages.

  Args:
    objective: ``objective(outputs, rollout, estimate) -> (loss, metrics)``.
    model: the policy.
    batch: the `Rollout`.
    advantages: ``[B, L]`` token advantages.
    actions: the task's action restrictions.

  Returns:
    the flattened gradient ``[P]``.
  """
  loss = lambda m: objective(forward.policy_outputs(m, batch, 1.0, actions), batch,
                             Estimate(advantages=advantages))[0]
  return jax.flatten_util.ravel_pytree(nnx.grad(loss)(model))[0]


def success_gradient(model, config: key_token.KeyTokenConfig, prompts, targets):
  """The expected success J and its true gradient on filler-blind key_token, in closed form.
  Traceable.

  ``J(theta) = mean_i V(x_i)``, V the root of the exact value tree
  (`key_token.oracle.decisive_values`: the policy's key conditionals along each prompt's
  key prefixes, from one teacher-forced pass), differentiated through that pass: the
  gradient a policy-gradient estimate's expectation is compared with, free of sampling noise.

  Args:
    model: the policy.
    config: the task's `KeyTokenConfig` (filler-blind and constrained).
    prompts: ``[n, K + 2]`` prompt ids.
    targets: ``[n, K]`` the key ids each must copy.

  Returns:
    ``(J, grad)``: a float32 scalar and the flattened ``[P]`` gradient of J (ascent; a
    loss's gradient, as `policy_gradient` gives, points the other way).

  Examples:
    >>> from flax import nnx
    >>> from jaxcredit import models
    >>> from jaxcredit.lab import gradients
    >>> from jaxcredit.tasks import key_token
    >>> config = key_token.KeyTokenConfig(length=6, n_keys=3, n_decisive=2, filler_blind=True)
    >>> model = models.Transformer(models.preset("tiny", vocab_size=key_token.VOCAB_SIZE),
    ...                            rngs=nnx.Rngs(0))
    >>> prompts, targets = key_token.traceable.prompts_of([[0, 2], [1, 1]], config)
    >>> j, grad = gradients.success_gradient(model, config, prompts, targets)
    >>> grad.shape == jax.flatten_util.ravel_pytree(nnx.state(model, nnx.Param))[0].shape
    True
  """
  success = lambda m: jnp.mean(key_token.oracle.decisive_values(m, config, prompts,
                                                                targets)[0][:, 0])
  j, grads = nnx.value_and_grad(success)(model)
  return j, jax.flatten_util.ravel_pytree(grads)[0]


def group_gradients(objective, model, batch: Rollout, advantages, actions: Actions):
  """The objective's gradient on each group of a batch alone, for given token advantages
  (computed on the whole batch: a batch-level scale such as RMS stays the batch's), for one
  set of advantages or several at once.

  Each group's forward pass is taken once and pulled back for every set of advantages (the
  chain rule through the policy's outputs), so R estimators' gradients cost one forward and
  R backward passes per group.

  Args:
    objective: ``objective(outputs, rollout, estimate) -> (loss, metrics)``.
    model: the policy.
    batch: the `Rollout`, ``[B, L]`` in groups of ``batch.group_size`` contiguous rows.
    advantages: ``[B, L]`` token advantages, or ``[R, B, L]`` for R estimators.
    actions: the task's action restrictions.

  Returns:
    ``[B / G, P]`` (``[R, B / G, P]``): each group's flattened gradient; their mean is the
    batch's gradient when the objective averages over responses.
  """
  groups = batch.tokens.shape[0] // batch.group_size
  split = lambda x: x.reshape(groups, batch.group_size, *x.shape[1:])
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  stacked = advantages if advantages.ndim == 3 else advantages[None]

  def one(group, credits):
    outputs, pullback = jax.vjp(
        lambda params: forward.policy_outputs(nnx.merge(graphdef, params, rest), group, 1.0,
                                              actions), params)
    def gradient(credit):
      loss = lambda outputs: objective(outputs, group, Estimate(advantages=credit))[0]
      return jax.flatten_util.ravel_pytree(pullback(jax.grad(loss)(outputs))[0])[0]
    return jax.vmap(gradient)(credits)

  per_group = jax.vmap(one, in_axes=(0, 1), out_axes=1)(
      jax.tree.map(split, batch), jax.vmap(split)(stacked))
  return per_group if advantages.ndim == 3 else per_group[0]


def gradient_noise(ascents, true_gradient) -> dict:
  """How much of an arm's gradient is signal, and how well its expectation points along the
  true gradient, from independent per-group estimates.

  With g_i ``[N, P]`` the arm's ascent directions (negated loss gradients) of N groups and
  their mean g::

    trace           tr S = sum_p var_i(g_ip) (ddof 1), the per-group noise
    signal          |E g|^2 without bias: |g|^2 - tr S / N, at least 0
    noise_scale     B_noise = tr S / |E g|^2, McCandlish et al.'s simple noise scale in the
                    arm's own units (so not the scale of its credit): the groups per batch
                    at which noise and signal are equal
    cosine_to_true  <g, grad J> / (|grad J| sqrt(signal)), clipped to [-1, 1]: the cosine of
                    the arm's expected gradient with the true one, corrected for the noise
    projection      <g, grad J> / |grad J|: the mean's component along the true gradient,
                    unbiased for E g's, and measurable where the signal is too weak to be

  An SGD step along a batch of B groups then improves J at best by
  ``|grad J|^2 cos^2 / (2 (1 + B_noise / B))`` in the quadratic model, beside
  ``|grad J|^2 / 2`` for the true gradient; a step of fixed length along the batch's mean
  by about ``|grad J| projection / sqrt(signal + trace / B)`` per unit of length.

  Args:
    ascents: ``[N, P]`` per-group ascent directions, N >= 2.
    true_gradient: ``[P]`` the gradient of J (`success_gradient`).

  Returns:
    ``{"trace", "signal", "noise_scale", "cosine_to_true", "projection"}`` float32 scalars.
    Without signal the noise scale is trace / 1e-30 (finite) and the cosine 0; without a
    true gradient the projection is 0.

  References:
    McCandlish et al., 2018, "An Empirical Model of Large-Batch Training", arXiv 1812.06162.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.lab import gradients
    >>> out = gradients.gradient_noise(jnp.array([[1.0, 0.0], [3.0, 0.0]]),
    ...                                  jnp.array([1.0, 1.0]))
    >>> [round(float(out[k]), 3) for k in ("trace", "signal", "noise_scale", "cosine_to_true")]
    [2.0, 3.0, 0.667, 0.816]
  """
  n = ascents.shape[0]
  mean = jnp.mean(ascents, axis=0)
  trace = jnp.sum(jnp.var(ascents, axis=0, ddof=1))
  signal = jnp.maximum(jnp.sum(mean**2) - trace / n, 0.0)
  norm = jnp.linalg.norm(true_gradient) * jnp.sqrt(signal)
  cosine = jnp.where(norm > 0, jnp.dot(mean, true_gradient) / jnp.where(norm > 0, norm, 1.0), 0.0)
  true_norm = jnp.linalg.norm(true_gradient)
  projection = jnp.dot(mean, true_gradient) / jnp.where(true_norm > 0, true_norm, 1.0)
  return {"trace": trace, "signal": signal, "noise_scale": trace / jnp.maximum(signal, 1e-30),
          "cosine_to_true": jnp.clip(cosine, -1.0, 1.0), "projection": projection}


def zero_variance_probability(model, config: key_token.KeyTokenConfig, prompts, targets,
                              group_size: int):
  """The chance that a group of G responses to each prompt all get the same reward (GRPO's
  credit is then 0 on every token), exactly, on filler-blind key_token. Traceable.

  ``sum_r P(R = r | x)^G``, the reward's distribution read from the policy's joint key
  distribution (`key_token.oracle.key_distribution`) under the task's rule; under rule `all`
  it is ``V(x)^G + (1 - V(x))^G``.

  Args:
    model: the policy.
    config: the task's `KeyTokenConfig` (filler-blind and constrained).
    prompts: ``[n, K + 2]`` prompt ids.
    targets: ``[n, K]`` the key ids each must copy.
    group_size: G.

  Returns:
    float32 ``[n]``.

  Examples:
    >>> from flax import nnx
    >>> from jaxcredit import models
    >>> from jaxcredit.lab import gradients
    >>> from jaxcredit.tasks import key_token
    >>> config = key_token.KeyTokenConfig(length=6, n_keys=3, n_decisive=2, filler_blind=True)
    >>> model = models.Transformer(models.preset("tiny", vocab_size=key_token.VOCAB_SIZE),
    ...                            rngs=nnx.Rngs(0))
    >>> prompts, targets = key_token.traceable.prompts_of([[0, 2]], config)
    >>> gradients.zero_variance_probability(model, config, prompts, targets, 8).shape
    (1,)
  """
  joint = key_token.oracle.key_distribution(model, config, prompts)  # [n, M]
  keys = procedural.key_tuples(config.n_keys, config.n_decisive)  # key_distribution's order
  rewards = key_token.rule_reward(key_token.KEY0 + jnp.asarray(keys)[None],
                                  jnp.asarray(targets)[:, None], config)  # [n, M]
  # P(R = the reward of u) for each u; then sum_r P(R = r)^G = sum_u P(u) P(R = R(u))^(G - 1).
  same = (rewards[:, :, None] == rewards[:, None, :]).astype(joint.dtype)
  reward_probability = jnp.einsum("nuv,nv->nu", same, joint)
  return jnp.sum(joint * reward_probability ** (group_size - 1), axis=-1)
