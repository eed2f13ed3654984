"""The policy-loss zoo, value/entropy terms, KL shaping and IPO/SimPO vs references."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxcredit import losses
from tests import reference
from tests.conftest import poison, random_mask
from tests.unit.losses.test_losses import _policy_batch

SHAPES = [(1, 1), (4, 9), (6, 17)]


def _poisoned(logp, old_logp, adv, mask):
  return poison(logp, mask), poison(old_logp, mask, -np.inf), poison(adv, mask), mask


class TokenPolicyLossesTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(shape=SHAPES, aggregation=["token-mean", "seq-mean-token-sum"])
  def test_pg_cispo_sapo(self, shape, aggregation):
    logp, old_logp, adv, mask = _policy_batch(shape, seed=10)
    inputs = _poisoned(logp, old_logp, adv, mask)
    pg, _ = self.variant(lambda l, a, m: losses.pg_loss(l, a, m, aggregation=aggregation))(
        inputs[0], inputs[2], mask)
    np.testing.assert_allclose(pg, reference.aggregate(-adv * logp, mask, aggregation), atol=1e-5)
    cispo, metrics = self.variant(lambda *a: losses.cispo_loss(
        *a, clip_low=0.2, clip_high=0.3, aggregation=aggregation))(*inputs)
    want = reference.aggregate(
      reference.cispo_tokens(logp, old_logp, adv, 0.2, 0.3), mask, aggregation
    )
    np.testing.assert_allclose(cispo, want, atol=1e-5)
    self.assertTrue(all(np.isfinite(v) for v in metrics.values()))
    sapo, _ = self.variant(
      lambda *a: losses.sapo_loss(*a, tau_pos=1.0, tau_neg=2.0, aggregation=aggregation)
    )(*inputs)
    want = reference.aggregate(
      reference.sapo_tokens(logp, old_logp, adv, 1.0, 2.0), mask, aggregation
    )
    np.testing.assert_allclose(sapo, want, atol=1e-5)

  def test_cispo_gradient_keeps_clipped_tokens(self):
    """d/dlogp = -clip(r) A / n_valid: the clipped weight scales, never zeroes, the gradient."""
    logp, old_logp, adv, mask = _policy_batch((3, 8), seed=11)
    grad = jax.grad(
      lambda l: losses.cispo_loss(l, old_logp, adv, mask, clip_low=0.2, clip_high=0.2)[0]
    )(logp)
    weight = np.clip(np.exp(logp.astype(np.float64) - old_logp), 0.8, 1.2)
    np.testing.assert_allclose(grad, np.where(mask, -weight * adv / mask.sum(), 0.0), atol=1e-6)

  def test_sapo_on_policy_gradient_is_policy_gradient(self):
    _, old_logp, adv, mask = _policy_batch((3, 8), seed=12)
    grad = jax.grad(lambda l: losses.sapo_loss(l, old_logp, adv, mask)[0])(old_logp)
    np.testing.assert_allclose(grad, np.where(mask, -adv / mask.sum(), 0.0), atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(shape=SHAPES, clip=[(0.4, 0.4), (0.05, 0.1)])
  def test_gmpo(self, shape, clip):
    logp, old_logp, adv, mask = _policy_batch(shape, seed=13)
    loss, metrics = self.variant(
      lambda *a: losses.gmpo_loss(*a, clip_low=clip[0], clip_high=clip[1])
    )(*_poisoned(logp, old_logp, adv, mask))
    np.testing.assert_allclose(loss, reference.gmpo(logp, old_logp, adv, mask, *clip), atol=1e-5)
    self.assertTrue(all(np.isfinite(v) for v in metrics.values()))

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*SHAPES)
  def test_gspo_token_value_and_gradient(self, *shape):
    logp, old_logp, _, mask = _policy_batch(shape, seed=14)
    logp = (old_logp + 0.01 * (logp - old_logp)).astype(np.float32)
    seq_adv = np.random.default_rng(15).normal(size=shape[0]).astype(np.float32)
    adv = np.broadcast_to(seq_adv[:, None], shape).astype(np.float32)
    fn = self.variant(
      lambda l: losses.gspo_token_loss(l, old_logp, adv, mask, clip_low=0.2, clip_high=0.2)[0]
    )
    want = reference.aggregate(
      reference.gspo_token_tokens(logp, old_logp, adv, mask, 0.2, 0.2), mask, "seq-mean-token-mean"
    )
    np.testing.assert_allclose(fn(logp), want, atol=1e-5)
    gspo_grad = jax.grad(
      lambda l: losses.gspo_loss(l, old_logp, seq_adv, mask, clip_low=0.2, clip_high=0.2)[0]
    )
    np.testing.assert_allclose(jax.grad(fn)(logp), gspo_grad(logp), atol=1e-6)


class CovarianceLossesTest(parameterized.TestCase):
  def _batch(self, seed):
    logp, old_logp, adv, mask = _policy_batch((6, 30), seed=seed)
    return (3 * adv).astype(np.float32), logp, old_logp, mask

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(0.02, 0.2)
  def test_clip_cov_deterministic(self, fraction):
    adv, logp, old_logp, mask = self._batch(16)
    loss, metrics = self.variant(
      lambda *a: losses.clip_cov_loss(*a, cov_fraction=fraction, cov_low=0.1, cov_high=5.0)
    )(*_poisoned(logp, old_logp, adv, mask))
    tokens = reference.ppo_clip_tokens(logp, old_logp, adv, 0.2, 0.2)
    ratio = np.exp(logp.astype(np.float64) - old_logp)
    clipped = -adv * np.clip(ratio, 0.8, 1.2) > -adv * ratio
    cov = reference.covariance(logp, adv, mask)
    eligible = mask & ~clipped & (cov > 0.1) & (cov < 5.0)
    selected = reference.top_n(cov, eligible, max(int(fraction * mask.sum()), 1))
    self.assertGreater(selected.sum(), 0)
    np.testing.assert_allclose(
      loss, reference.aggregate(np.where(selected, 0, tokens), mask, "token-mean"), atol=1e-5
    )
    np.testing.assert_allclose(metrics["cov_clipfrac"], selected.sum() / mask.sum(), atol=1e-6)

  def test_clip_cov_random_selection_count(self):
    adv, logp, old_logp, mask = self._batch(17)
    _, metrics = losses.clip_cov_loss(
      logp,
      old_logp,
      adv,
      mask,
      cov_fraction=0.05,
      cov_low=-1e9,
      cov_high=1e9,
      key=jax.random.key(0),
    )
    n = max(int(0.05 * mask.sum()), 1)
    np.testing.assert_allclose(metrics["cov_clipfrac"], n / mask.sum(), atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(0.02, 0.3)
  def test_kl_cov(self, fraction):
    adv, logp, old_logp, mask = self._batch(18)
    loss, _ = self.variant(lambda *a: losses.kl_cov_loss(*a, kl_fraction=fraction, kl_coef=2.0))(
      *_poisoned(logp, old_logp, adv, mask)
    )
    log_ratio = logp.astype(np.float64) - old_logp
    selected = reference.top_n(
      reference.covariance(logp, adv, mask), mask, max(int(fraction * mask.sum()), 1)
    )
    tokens = -adv * np.exp(log_ratio) + np.where(selected, 2.0 * np.abs(log_ratio), 0)
    np.testing.assert_allclose(loss, reference.aggregate(tokens, mask, "token-mean"), atol=1e-5)


class ValueEntropyKlTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(clip=[None, 0.2], aggregation=["token-mean", "seq-mean-token-mean"])
  def test_value_loss(self, clip, aggregation):
    rng = np.random.default_rng(19)
    mask = random_mask(rng, (5, 11))
    values, old_values, returns = rng.normal(size=(3, 5, 11)).astype(np.float32)
    loss, metrics = self.variant(
      lambda *a: losses.value_loss(*a, clip=clip, aggregation=aggregation)
    )(poison(values, mask), poison(old_values, mask), poison(returns, mask), mask)
    want = reference.aggregate(
      reference.value_tokens(values, old_values, returns, clip), mask, aggregation
    )
    np.testing.assert_allclose(loss, want, atol=1e-5)
    np.testing.assert_allclose(metrics["mse"], ((values - returns) ** 2)[mask].mean(), atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_entropy_bonus_and_kl_shaping(self):
    rng = np.random.default_rng(20)
    mask = random_mask(rng, (4, 7))
    entropy = rng.exponential(size=(4, 7)).astype(np.float32)
    loss, metrics = self.variant(losses.entropy_bonus)(poison(entropy, mask), mask)
    np.testing.assert_allclose(loss, -entropy[mask].mean(), rtol=1e-5)
    logp, ref_logp, _, _ = _policy_batch((4, 7), seed=21)
    rewards = rng.normal(size=(4, 7)).astype(np.float32)
    for kind in losses.KL_KINDS:
      shaped = self.variant(lambda *a: losses.kl_reward_shaping(*a, coef=0.1, kind=kind))(
        poison(rewards, mask), poison(logp, mask), ref_logp, mask
      )
      want = np.where(mask, rewards - 0.1 * reference.kl(logp, ref_logp, kind), 0.0)
      np.testing.assert_allclose(shaped, want, atol=1e-5)


class PreferenceLossesTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(0.1, 0.5)
  def test_ipo_and_simpo(self, beta):
    rng = np.random.default_rng(22)
    pc, pr, rc, rr = (-rng.exponential(5.0, size=6).astype(np.float32) for _ in range(4))
    loss, _ = self.variant(lambda *a: losses.ipo_loss(*a, beta=beta))(pc, pr, rc, rr)
    np.testing.assert_allclose(loss, reference.ipo(pc, pr, rc, rr, beta), rtol=1e-5)
    lc, lr = rng.integers(1, 20, (2, 6))
    loss, metrics = self.variant(lambda *a: losses.simpo_loss(*a, beta=beta * 10, gamma=0.5))(
      pc, pr, lc, lr
    )
    np.testing.assert_allclose(loss, reference.simpo(pc, pr, lc, lr, beta * 10, 0.5), rtol=1e-5)
    self.assertTrue(all(np.isfinite(v) for v in metrics.values()))

  def test_simpo_zero_length_is_finite(self):
    loss, _ = losses.simpo_loss(jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.array([0, 3]))
    self.assertTrue(np.isfinite(loss))
    with pytest.raises(ValueError, match=r"rejected_lengths\[3\]"):
      losses.simpo_loss(jnp.zeros(2), jnp.zeros(2), jnp.ones(2), jnp.ones(3))
