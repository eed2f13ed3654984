"""The lab's gradients against enumeration and float64 references."""

import dataclasses
import itertools

import chex
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit import forward, losses, models, rollout
from jaxcredit.lab import cells, gradients
from jaxcredit.tasks import key_token


def _enumerated(model, config, keys):
  """Every allowed response y of the prompt of `keys`, its reward and pi(y | x), each response
  teacher-forced in full (filler hidden from the inputs as the sampler hides it)."""
  allowed = key_token.allowed(config)
  responses = np.array(list(itertools.product(*[np.flatnonzero(a) for a in allowed])))
  prompt = np.concatenate([[key_token.BOS], key_token.KEY0 + np.asarray(keys), [key_token.SEP]])
  rows = np.concatenate([np.tile(prompt, (len(responses), 1)),
                         key_token.observe(responses, config)], axis=1)
  logits = model(jnp.asarray(rows), positions=jnp.broadcast_to(jnp.arange(rows.shape[1]),
                                                               rows.shape),
                 token_valid=jnp.ones(rows.shape, bool)).logits.astype(jnp.float32)
  logits = logits[:, len(prompt) - 1:-1]  # the logits that pick each response token
  logp = jax.nn.log_softmax(jnp.where(allowed[None], logits, -jnp.inf), axis=-1)
  picked = jnp.take_along_axis(logp, jnp.asarray(responses)[..., None], axis=-1)[..., 0]
  reward = key_token.rule_reward(responses[:, config.decisive_positions],
                                 key_token.KEY0 + np.asarray(keys)[None], config)
  return reward, jnp.exp(picked.sum(-1))


def _enumerated_success(model, config, symbols):
  """J by summing R(x, y) pi(y | x) over every allowed response y of every prompt."""
  total = 0.0
  for keys in symbols:
    reward, probability = _enumerated(model, config, keys)
    total = total + jnp.sum(jnp.asarray(reward, jnp.float32) * probability)
  return total / len(symbols)


def _task_and_policy(rule: str, n_keys: int, seed: int):
  """Filler-blind key_token, T = 5, K = 2, |F| = 2, and a random tiny policy."""
  config = key_token.KeyTokenConfig(length=5, n_decisive=2, n_keys=n_keys, n_fillers=2,
                                    rule=rule, filler_blind=True)
  return config, models.Transformer(models.preset("tiny", vocab_size=key_token.VOCAB_SIZE),
                                    rngs=nnx.Rngs(seed))


@pytest.mark.parametrize("rule", ["all", "count"])
def test_success_gradient_equals_the_gradient_of_the_enumerated_success(rule):
  config, model = _task_and_policy(rule, n_keys=2, seed=3)
  symbols = np.array(list(itertools.product(range(config.n_keys), repeat=config.n_decisive)))
  prompts, targets = key_token.traceable.prompts_of(symbols, config)
  j, grad = jax.jit(lambda m: gradients.success_gradient(m, config, prompts, targets))(model)
  want_j, want_grads = nnx.value_and_grad(
      lambda m: _enumerated_success(m, config, symbols))(model)
  want = jax.flatten_util.ravel_pytree(want_grads)[0]
  np.testing.assert_allclose(j, want_j, rtol=1e-5)
  assert np.linalg.norm(want) > 1e-3  # a gradient that can tell the two apart
  np.testing.assert_allclose(grad, want, rtol=1e-3, atol=1e-6 * np.abs(want).max())


def _noise_reference(ascents, true_gradient):
  """float64: the trace of the sample covariance, the unbiased squared norm of the mean."""
  g = np.asarray(ascents, np.float64)
  trace = np.trace(np.atleast_2d(np.cov(g, rowvar=False)))
  mean = g.mean(axis=0)
  signal = max(mean @ mean - trace / len(g), 0.0)
  cosine = mean @ true_gradient / (np.linalg.norm(true_gradient) * np.sqrt(signal))
  return {"trace": trace, "signal": signal, "noise_scale": trace / signal,
          "cosine_to_true": np.clip(cosine, -1, 1),
          "projection": mean @ true_gradient / np.linalg.norm(true_gradient)}


class GradientNoiseTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_equals_a_float64_reference(self):
    for groups, params in ((2, 3), (8, 50), (32, 7)):
      _check_noise(self.variant(gradients.gradient_noise), groups, params)


def _check_noise(gradient_noise, groups, params):
  rng = np.random.default_rng(groups * params)
  for _ in range(3):
    direction = rng.normal(size=params)
    ascents = direction + rng.normal(scale=rng.uniform(0.1, 3.0), size=(groups, params))
    true_gradient = direction + rng.normal(scale=0.5, size=params)
    got = gradient_noise(jnp.asarray(ascents, jnp.float32),
                         jnp.asarray(true_gradient, jnp.float32))
    want = _noise_reference(ascents, true_gradient)
    assert want["signal"] > 1e-2  # away from float32's cancellation near no signal
    for name, value in want.items():
      np.testing.assert_allclose(got[name], value, rtol=2e-4, err_msg=name)


def test_gradient_noise_reads_the_noise_scale_and_the_cosine_of_the_expected_gradient():
  """Many groups drawn around a mean: the noise scale tends to tr Sigma / |mu|^2 and the
  cosine to that of mu, whatever the arm's scale; no signal reads 0, finite."""
  rng = np.random.default_rng(0)
  mu, true_gradient = np.array([1.0, 1.0, 0.0, 0.0]), np.array([1.0, 0.0, 0.0, 0.0])
  scales = np.array([2.0, 1.0, 1.0, 3.0])  # tr Sigma = 15, |mu|^2 = 2
  ascents = mu + scales * rng.normal(size=(100_000, 4))
  for c in (1.0, 1e-3):
    out = gradients.gradient_noise(jnp.asarray(c * ascents, jnp.float32),
                                     jnp.asarray(true_gradient, jnp.float32))
    np.testing.assert_allclose(out["noise_scale"], 7.5, rtol=0.03)
    np.testing.assert_allclose(out["cosine_to_true"], np.sqrt(0.5), rtol=0.03)
    np.testing.assert_allclose(out["projection"], c * 1.0, rtol=0.03)
  # Batched over arms (vmap), one of them pure noise around 0.
  stacked = jnp.asarray(np.stack([ascents[:64], ascents[:64] - mu]), jnp.float32)
  out = jax.vmap(gradients.gradient_noise, in_axes=(0, None))(stacked,
                                                                jnp.asarray(true_gradient))
  assert all(np.isfinite(v).all() for v in out.values())
  identical = gradients.gradient_noise(jnp.zeros((4, 3)), jnp.ones(3))
  assert float(identical["noise_scale"]) == 0.0 and float(identical["cosine_to_true"]) == 0.0
  flat = gradients.gradient_noise(jnp.ones((4, 3)), jnp.zeros(3))
  assert float(flat["projection"]) == 0.0 and float(flat["cosine_to_true"]) == 0.0


def test_group_gradients_average_to_the_batch_gradient():
  config = key_token.KeyTokenConfig(length=6, n_decisive=2, n_keys=3, n_fillers=2,
                                    filler_blind=True)
  model = models.Transformer(models.preset("tiny", vocab_size=key_token.VOCAB_SIZE),
                             rngs=nnx.Rngs(0))
  rng, group_size, groups = np.random.default_rng(0), 4, 3
  allowed = key_token.allowed(config)
  responses = np.stack([[rng.choice(np.flatnonzero(a)) for a in allowed]
                        for _ in range(group_size * groups)])
  symbols = np.repeat(rng.integers(0, config.n_keys, (groups, config.n_decisive)), group_size,
                      axis=0)
  prompts, _ = key_token.traceable.prompts_of(symbols, config)
  tokens = jnp.concatenate([prompts, jnp.asarray(responses, jnp.int32)], axis=1)
  mask = jnp.zeros(tokens.shape, bool).at[:, config.prompt_length:].set(True)
  actions = key_token.row_actions(config)
  batch = rollout.Rollout(tokens=tokens, mask=mask, rewards=jnp.zeros(len(tokens)),
                          group_size=group_size)
  batch = dataclasses.replace(batch, behaviour_logprobs=forward.policy_outputs(
      model, batch, 1.0, actions).logprobs)  # on-policy: ratio 1
  advantages = jnp.where(mask, jnp.asarray(rng.normal(size=tokens.shape), jnp.float32), 0.0)
  advantages = advantages.at[:group_size].set(0.0)  # the first group gives no gradient
  objective = losses.from_config(cells.DEFAULT_OBJECTIVE)
  # Jitted (each eagerly would compile every operation of the model's gradient).
  group_gradients = jax.jit(lambda m, b, a: gradients.group_gradients(objective, m, b, a,
                                                                        actions))
  policy_gradient = jax.jit(lambda m, b, a: gradients.policy_gradient(objective, m, b, a,
                                                                        actions))
  per_group = group_gradients(model, batch, advantages)
  whole = policy_gradient(model, batch, advantages)
  assert per_group.shape == (groups, whole.shape[0])
  np.testing.assert_allclose(per_group.mean(axis=0), whole, rtol=1e-4,
                             atol=1e-6 * np.abs(whole).max())
  assert float(jnp.abs(per_group[0]).max()) == 0.0 and float(jnp.abs(per_group[1]).max()) > 0
  # Several estimators at once: each one's per-group gradients, as alone.
  other = jnp.where(mask, jnp.asarray(rng.normal(size=tokens.shape), jnp.float32), 0.0)
  both = group_gradients(model, batch, jnp.stack([advantages, other]))
  alone = group_gradients(model, batch, other)
  assert both.shape == (2, groups, whole.shape[0])
  np.testing.assert_allclose(both[0], per_group, rtol=1e-4, atol=1e-6 * np.abs(whole).max())
  np.testing.assert_allclose(both[1], alone, rtol=1e-4, atol=1e-6 * np.abs(alone).max())
  np.testing.assert_allclose(
      alone[2], policy_gradient(model, jax.tree.map(lambda x: x[2 * group_size:], batch),
                                other[2 * group_size:]),
      rtol=1e-4, atol=1e-6 * np.abs(alone).max())


@pytest.mark.parametrize("rule", ["all", "count"])
def test_zero_variance_probability_equals_the_enumerated_reward_distribution(rule):
  config, model = _task_and_policy(rule, n_keys=3, seed=1)
  symbols = np.array([[0, 1], [2, 2], [1, 0]])
  prompts, targets = key_token.traceable.prompts_of(symbols, config)
  joint = key_token.oracle.key_distribution(model, config, prompts)
  for group_size in (1, 2, 8):
    got = gradients.zero_variance_probability(model, config, prompts, targets, group_size)
    for i, keys in enumerate(symbols):
      reward, probability = _enumerated(model, config, keys)
      by_reward = [float(np.sum(np.asarray(probability, np.float64)[reward == r]))
                   for r in np.unique(reward)]
      np.testing.assert_allclose(got[i], np.sum(np.power(by_reward, group_size)), rtol=1e-5)
  # The joint key distribution: pi summed over the responses holding each key tuple.
  allowed = key_token.allowed(config)
  responses = np.array(list(itertools.product(*[np.flatnonzero(a) for a in allowed])))
  tuples = (responses[:, config.decisive_positions] - key_token.KEY0) @ [config.n_keys, 1]
  _, probability = _enumerated(model, config, symbols[0])
  np.testing.assert_allclose(joint[0], np.bincount(tuples, np.asarray(probability, np.float64),
                                                   minlength=config.n_keys**2), rtol=1e-5)
  if rule == "all":
    v = key_token.oracle.exact_success(model, config, prompts, targets)
    np.testing.assert_allclose(
        gradients.zero_variance_probability(model, config, prompts, targets, 8),
        v**8 + (1 - v) ** 8, rtol=1e-5)
