"""Hostile numeric input: stale-policy log-ratios, huge rewards, out-of-vocabulary
ids, invalid hyperparameters and mis-shaped extras. Each case once gave a NaN
gradient behind a finite loss, a silent wrong answer or a raw broadcasting error."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxcredit import estimators, logprobs, losses
from jaxcredit.testing import strategies
from tests import reference
from tests.conftest import random_mask

# exp overflows float32 from ~88.7 on; 1e4 is absurd but finite.
LARGE_LOG_RATIOS = [89.0, 100.0, 1e4, -1e4]


def _stale_batch(log_ratio, seed=0):
  """[4, 5] log-probs whose log-ratio to the behaviour policy is `log_ratio` on
  every valid token, with advantages of both signs."""
  rng = np.random.default_rng(seed)
  logp = jnp.asarray(-rng.exponential(1.0, (4, 5)), jnp.float32)
  old_logp = logp - log_ratio
  advantages = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
  return logp, old_logp, advantages, jnp.asarray(random_mask(rng, (4, 5), holes=False))


RATIO_LOSSES = {
  "ppo_clip": losses.ppo_clip_loss,
  "ppo_dual_clip": lambda *a: losses.ppo_clip_loss(*a, dual_clip=3.0),
  "ppo_clip_higher_seq_sum": lambda *a: losses.ppo_clip_loss(
    *a, clip_high=0.28, aggregation="seq-mean-token-sum"
  ),
  "gspo_token": losses.gspo_token_loss,
  "cispo": losses.cispo_loss,
  "gmpo": losses.gmpo_loss,
  "sapo": losses.sapo_loss,
  "clip_cov": losses.clip_cov_loss,
  "kl_cov": losses.kl_cov_loss,
  "gspo": lambda logp, old, adv, mask: losses.gspo_loss(logp, old, adv[:, 0], mask),
}


class LargeLogRatioTest(parameterized.TestCase):
  @parameterized.product(name=sorted(RATIO_LOSSES), log_ratio=LARGE_LOG_RATIOS)
  def test_ratio_losses_keep_finite_loss_metrics_and_gradients(self, name, log_ratio):
    fn = RATIO_LOSSES[name]
    logp, old_logp, advantages, mask = _stale_batch(log_ratio)
    loss, metrics = jax.jit(fn)(logp, old_logp, advantages, mask)
    grads = jax.jit(jax.grad(lambda lp, old: fn(lp, old, advantages, mask)[0], argnums=(0, 1)))(
      logp, old_logp
    )
    assert np.isfinite(loss), loss
    assert all(np.isfinite(v) for v in metrics.values()), metrics
    for g in grads:
      assert np.all(np.isfinite(g)), g

  @parameterized.parameters(89.0, 100.0, 700.0)  # exp(700) is still finite in the float64 reference
  def test_ppo_clip_equals_the_float64_reference_where_the_clip_is_active(self, log_ratio):
    # Positive advantages with a huge ratio: the clipped branch, -A (1 + clip_high), is exact.
    logp, old_logp, advantages, mask = _stale_batch(log_ratio)
    advantages = jnp.abs(advantages)
    loss, _ = losses.ppo_clip_loss(logp, old_logp, advantages, mask)
    tokens = reference.ppo_clip_tokens(logp, old_logp, advantages, 0.2, 0.2)
    np.testing.assert_allclose(
      loss, reference.aggregate(tokens, np.asarray(mask), "token-mean"), rtol=1e-6
    )
    grad = jax.grad(lambda lp: losses.ppo_clip_loss(lp, old_logp, advantages, mask)[0])(logp)
    np.testing.assert_array_equal(grad, 0.0)  # clipped: no gradient, not NaN

  def test_dual_clip_bounds_the_loss_of_negative_advantages_at_any_ratio(self):
    logp, old_logp, advantages, mask = _stale_batch(700.0)
    advantages = -jnp.abs(advantages)
    loss, _ = losses.ppo_clip_loss(logp, old_logp, advantages, mask, dual_clip=3.0)
    tokens = reference.ppo_clip_tokens(logp, old_logp, advantages, 0.2, 0.2, dual_clip=3.0)
    np.testing.assert_allclose(
      loss, reference.aggregate(tokens, np.asarray(mask), "token-mean"), rtol=1e-6
    )

  @parameterized.parameters(-100.0, -1e4, 100.0)
  def test_k3_kl_is_finite_with_finite_gradient(self, d):
    logp = jnp.full((2, 3), -1.0)
    value, grad = jax.value_and_grad(lambda lp: jnp.sum(losses.kl_penalty(lp, lp - d, kind="k3")))(
      logp
    )
    assert np.isfinite(value) and np.all(np.isfinite(grad)) and value >= 0

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*LARGE_LOG_RATIOS)
  def test_vtrace_matches_the_float64_reference_and_keeps_gradients_finite(self, log_ratio):
    rng = np.random.default_rng(1)
    shape = (3, 7)
    rewards, values = (
      rng.normal(size=shape).astype(np.float32),
      rng.normal(size=shape).astype(np.float32),
    )
    mask = random_mask(rng, shape)
    log_rhos = np.where(rng.random(shape) < 0.5, log_ratio, rng.normal(size=shape)).astype(
      np.float32
    )
    fn = self.variant(lambda lr: estimators.vtrace(rewards, values, mask, lr, gamma=0.9, lam=0.95))
    vs, pg = fn(jnp.asarray(log_rhos))
    ref_vs, ref_pg = reference.vtrace(rewards, values, mask, log_rhos, 0.9, 0.95, 1.0, 1.0)
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pg, ref_pg, rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda lr: jnp.sum(fn(lr)[1]))(jnp.asarray(log_rhos))
    assert np.all(np.isfinite(grad))

  def test_importance_ratio_saturates_at_the_bound(self):
    x = jnp.array([-1e4, -20.0, 0.0, 20.0, 89.0, 1e4])
    np.testing.assert_allclose(logprobs.importance_ratio(x), np.exp(np.clip(x, -20, 20)), rtol=1e-6)
    assert np.all(np.isfinite(jax.grad(lambda v: jnp.sum(logprobs.importance_ratio(v)))(x)))


SCALES = [1e19, 1e30, 3e37]


class HugeRewardTest(parameterized.TestCase):
  """Normalised advantages are scale-invariant for every finite reward."""

  def _rewards(self, scale, batch=12, seed=0):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=batch)
    rewards[4:8] = rewards[4]  # a zero-variance group
    return (rewards * scale).astype(np.float32)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*SCALES)
  def test_group_normalisations_match_float64(self, scale):
    rewards = self._rewards(scale)
    r64 = rewards.astype(np.float64)
    np.testing.assert_allclose(
      self.variant(lambda r: estimators.grpo_advantages(r, group_size=4))(rewards),
      reference.grpo(r64, 4),
      rtol=1e-5,
      atol=1e-5,
    )
    np.testing.assert_allclose(
      self.variant(lambda r: estimators.grpo_batch_std_advantages(r, group_size=4))(rewards),
      reference.grpo_batch_std(r64, 4),
      rtol=1e-5,
      atol=1e-5,
    )
    np.testing.assert_allclose(
      self.variant(lambda r: estimators.gpg_advantages(r, group_size=4, scale_by_std=True))(
        rewards
      ),
      reference.gpg(r64, 4, True),
      rtol=1e-5,
      atol=1e-5,
    )
    # Un-normalised baselines keep the reward's scale: compare relative to it.
    for fn, ref in [
      (lambda r: estimators.rloo_advantages(r, group_size=4), reference.rloo(r64, 4)),
      (
        lambda r: estimators.grpo_advantages(r, group_size=4, scale_by_std=False),
        reference.grpo(r64, 4, scale_by_std=False),
      ),
    ]:
      np.testing.assert_allclose(
        self.variant(fn)(rewards) / scale, ref / scale, rtol=1e-5, atol=1e-5
      )

  def test_zero_variance_groups_stay_exactly_zero(self):
    rewards = self._rewards(1e19)
    out = jax.jit(lambda r: estimators.grpo_advantages(r, group_size=4, eps=0.0))(rewards)
    np.testing.assert_array_equal(out[4:8], 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(scale=SCALES, shift_mean=[True, False])
  def test_whiten_matches_float64(self, scale, shift_mean):
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(4, 9)) * scale).astype(np.float32)
    mask = random_mask(rng, (4, 9))
    out = self.variant(lambda x: estimators.whiten(x, mask, shift_mean=shift_mean))(x)
    ref = reference.whiten(x.astype(np.float64), mask, shift_mean=shift_mean)
    norm = scale if not shift_mean else 1.0  # the added-back mean keeps the scale
    np.testing.assert_allclose(out / norm, ref / norm, rtol=1e-5, atol=1e-5)

  @parameterized.parameters("reinforce_pp", "reinforce_pp_baseline", "grpo_batch_std", "grpo")
  def test_registered_estimators_are_scale_invariant(self, name):
    rollout = strategies.make_rollout(
      np.random.default_rng(3), batch=8, length=6, group_size=4, binary_rewards=False
    ).replace(token_rewards=None)
    fn = jax.jit(estimators.get(name))
    base = fn(rollout).advantages
    assert np.abs(base).max() > 0.1
    huge = fn(rollout.replace(rewards=rollout.rewards * 1e19)).advantages
    np.testing.assert_allclose(huge, base, rtol=1e-4, atol=1e-4)


class OutOfVocabularyTest(parameterized.TestCase):
  def _inputs(self):
    hidden = jax.random.normal(jax.random.key(0), (2, 5, 4))
    unembed = jax.random.normal(jax.random.key(1), (4, 7))
    tokens = jnp.array([[0, 6, -1, 3, 7], [-100, 2, 2, 100, 1]])
    return hidden, unembed, tokens

  def test_concrete_out_of_range_ids_raise_naming_the_first(self):
    hidden, unembed, tokens = self._inputs()
    with pytest.raises(
      ValueError, match=r"4 id\(s\) outside \[0, 7\) \(first: -1 at index \[0, 2\]\)"
    ):
      logprobs.token_logprobs(hidden @ unembed, tokens)
    with pytest.raises(ValueError, match=r"outside \[0, 7\)"):
      logprobs.chunked_token_logprobs(hidden, unembed, tokens, chunk_size=2)

  def test_traced_out_of_range_ids_give_nan_never_a_wrapped_logprob(self):
    hidden, unembed, tokens = self._inputs()
    bad = np.asarray((tokens < 0) | (tokens >= 7))
    full = jax.jit(lambda h, u, t: logprobs.token_logprobs(h @ u, t))(hidden, unembed, tokens)
    chunked = jax.jit(lambda h, u, t: logprobs.chunked_token_logprobs(h, u, t, chunk_size=2))(
      hidden, unembed, tokens
    )
    ref = reference.token_logprobs(
      np.asarray(hidden @ unembed, np.float64), np.where(bad, 0, tokens)
    )
    for out in (full, chunked):
      assert np.all(np.isnan(np.asarray(out)[bad]))
      np.testing.assert_allclose(np.asarray(out)[~bad], ref[~bad], rtol=1e-5, atol=1e-5)

  def test_chunked_backward_agrees_with_autodiff_of_the_full_logits(self):
    hidden, unembed, tokens = self._inputs()
    weights = jax.random.normal(jax.random.key(2), tokens.shape)  # non-zero cotangents everywhere
    full = lambda h, u, t: logprobs.token_logprobs(h @ u, t)
    chunked = lambda h, u, t: logprobs.chunked_token_logprobs(h, u, t, chunk_size=2)
    grads = lambda fn: jax.jit(
      jax.grad(lambda h, u, t: jnp.sum(weights * fn(h, u, t)), argnums=(0, 1))
    )(hidden, unembed, tokens)
    for a, b in zip(grads(full), grads(chunked)):
      assert np.all(np.isfinite(a))
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


class HyperparameterValidationTest(parameterized.TestCase):
  z = jnp.zeros((2, 3))
  m = jnp.ones((2, 3), bool)
  r = jnp.zeros(4)

  @parameterized.named_parameters(
    (
      "gae_gamma",
      lambda s: estimators.gae(s.z, s.z, s.m, gamma=1.5, lam=0.9),
      r"gamma must be in \[0, 1\], got 1.5",
    ),
    (
      "gae_lam",
      lambda s: estimators.gae(s.z, s.z, s.m, gamma=1.0, lam=-0.1),
      r"lam must be in \[0, 1\]",
    ),
    (
      "gae_nan",
      lambda s: estimators.gae(s.z, s.z, s.m, gamma=float("nan"), lam=0.9),
      r"gamma must be in \[0, 1\], got nan",
    ),
    (
      "returns_gamma",
      lambda s: estimators.discounted_returns(s.z, s.m, gamma=2.0),
      r"gamma must be",
    ),
    (
      "n_step_gamma",
      lambda s: estimators.n_step_returns(s.z, s.z, s.m, n=2, gamma=-1.0),
      r"gamma must be",
    ),
    (
      "vtrace_clip",
      lambda s: estimators.vtrace(s.z, s.z, s.m, s.z, gamma=1.0, clip_rho=0.0),
      r"clip_rho must be > 0",
    ),
    (
      "grpo_eps_nan",
      lambda s: estimators.grpo_advantages(s.r, group_size=2, eps=float("nan")),
      r"eps must be >= 0",
    ),
    ("whiten_eps", lambda s: estimators.whiten(s.z, s.m, eps=-1.0), r"eps must be >= 0"),
    (
      "clip_low",
      lambda s: losses.ppo_clip_loss(s.z, s.z, s.z, s.m, clip_low=-0.1),
      r"clip_low must be in \[0, 1\]",
    ),
    (
      "clip_high_nan",
      lambda s: losses.ppo_clip_loss(s.z, s.z, s.z, s.m, clip_high=float("nan")),
      r"clip_high must be >= 0",
    ),
    (
      "dual_clip_nan",
      lambda s: losses.ppo_clip_loss(s.z, s.z, s.z, s.m, dual_clip=float("nan")),
      r"dual_clip must be > 1",
    ),
    (
      "value_clip",
      lambda s: losses.value_loss(s.z, s.z, s.z, s.m, clip=-0.2),
      r"clip must be >= 0",
    ),
    ("dpo_beta", lambda s: losses.dpo_loss(s.r, s.r, s.r, s.r, beta=0.0), r"beta must be > 0"),
    ("ipo_beta", lambda s: losses.ipo_loss(s.r, s.r, s.r, s.r, beta=-1.0), r"beta must be > 0"),
    ("simpo_beta", lambda s: losses.simpo_loss(s.r, s.r, s.r, s.r, beta=0.0), r"beta must be > 0"),
    (
      "prime_beta",
      lambda s: estimators.implicit_process_rewards(s.z, s.z, s.m, beta=0.0),
      r"beta must be > 0",
    ),
    (
      "string_beta",
      lambda s: losses.dpo_loss(s.r, s.r, s.r, s.r, beta="0.1"),
      r"beta must be a number",
    ),
    (
      "string_mask",
      lambda s: losses.ppo_clip_loss(s.z, s.z, s.z, np.full((2, 3), "1")),
      r"mask must be a bool or 0/1 numeric array",
    ),
  )
  def test_invalid_hyperparameters_raise_naming_the_argument(self, call, message):
    with pytest.raises(ValueError, match=message):
      call(self)

  def test_traced_hyperparameters_are_not_checked(self):
    fn = jax.jit(lambda gamma: estimators.discounted_returns(self.z + 1.0, self.m, gamma=gamma))
    np.testing.assert_allclose(fn(0.5)[0], [1.75, 1.5, 1.0])


class ExtrasShapeTest(parameterized.TestCase):
  @parameterized.parameters(
    ("vtrace", "target_logprobs", (8, 1), r"\[B, T\] = \[8, 6\], got \[8, 1\]"),
    ("vtrace", "target_logprobs", (8, 7), r"\[B, T\] = \[8, 6\], got \[8, 7\]"),
    ("oracle", "oracle_advantages", (1, 6), r"got \[1, 6\]"),
    ("ktae", "ktae_scores", (6,), r"got \[6\]"),
    ("prime", "prm_logprobs", (8, 1), r"got \[8, 1\]"),
    ("vineppo", "mc_values", (8, 1), r"got \[8, 1\]"),
    ("remax", "baseline_rewards", (8, 1), r"\[B\] = \[8\], got \[8, 1\]"),
  )
  def test_mis_shaped_extras_raise_naming_the_key(self, name, key, shape, message):
    rollout = strategies.make_rollout(np.random.default_rng(0), batch=8, length=6, group_size=2)
    rollout = rollout.replace(extras={**rollout.extras, key: jnp.zeros(shape)})
    with pytest.raises(ValueError, match=rf"{name} needs rollout.extras\['{key}'\].*{message}"):
      estimators.get(name)(rollout)
