"""Losses and aggregation against float64 references; masking and bad input."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given
from hypothesis import strategies as st

from jaxcredit import losses
from tests import reference
from tests.conftest import SHAPES, poison, random_mask


def _policy_batch(shape, seed=0):
  """logp, old_logp near it (ratios straddle the clip range), advantages, mask."""
  rng = np.random.default_rng(seed)
  old_logp = -rng.exponential(2.0, size=shape).astype(np.float32)
  logp = (old_logp + 0.4 * rng.normal(size=shape)).astype(np.float32)
  advantages = rng.normal(size=shape).astype(np.float32)
  return logp, old_logp, advantages, random_mask(rng, shape)


class AggregateTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(shape=SHAPES, mode=losses.AGGREGATIONS, float_mask=[False, True])
  def test_matches_reference(self, shape, mode, float_mask):
    rng = np.random.default_rng(0)
    mask = random_mask(rng, shape)
    loss_tok = rng.normal(size=shape).astype(np.float32)
    mask_in = mask.astype(np.float32) if float_mask else mask
    got = self.variant(lambda l, m: losses.aggregate(l, m, mode))(poison(loss_tok, mask), mask_in)
    np.testing.assert_allclose(got, reference.aggregate(loss_tok, mask, mode), atol=1e-5)

  def test_norm_len(self):
    loss_tok, mask = np.ones((2, 4), np.float32), np.ones((2, 4), bool)
    got = losses.aggregate(loss_tok, mask, "seq-mean-token-sum-norm", norm_len=8)
    np.testing.assert_allclose(got, 8 / 16)

  def test_all_masked_is_zero_with_zero_grad(self):
    loss_tok = jnp.full((3, 4), jnp.nan)
    mask = jnp.zeros((3, 4), bool)
    for mode in losses.AGGREGATIONS:
      value, grad = jax.value_and_grad(lambda l: losses.aggregate(l, mask, mode))(loss_tok)
      self.assertEqual(float(value), 0.0)
      np.testing.assert_array_equal(grad, 0.0)

  def test_bad_input_raises(self):
    with pytest.raises(ValueError, match="Unknown aggregation mode 'mean'; known: token-mean"):
      losses.aggregate(jnp.zeros((2, 3)), jnp.ones((2, 3)), "mean")
    with pytest.raises(ValueError, match=r"loss_tok\[2, 3\], mask\[2, 4\]"):
      losses.aggregate(jnp.zeros((2, 3)), jnp.ones((2, 4)), "token-mean")


class PpoClipTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(
      shape=SHAPES,
      clip=[(0.2, 0.2), (0.2, 0.28)],
      dual_clip=[None, 3.0],
      aggregation=["token-mean", "seq-mean-token-mean"],
  )
  def test_matches_reference(self, shape, clip, dual_clip, aggregation):
    logp, old_logp, adv, mask = _policy_batch(shape)
    fn = self.variant(lambda *a: losses.ppo_clip_loss(
        *a, clip_low=clip[0], clip_high=clip[1], dual_clip=dual_clip, aggregation=aggregation))
    loss, metrics = fn(poison(logp, mask), poison(old_logp, mask, -np.inf), poison(adv, mask), mask)
    tokens = reference.ppo_clip_tokens(logp, old_logp, adv, *clip, dual_clip)
    np.testing.assert_allclose(loss, reference.aggregate(tokens, mask, aggregation), atol=1e-5)
    ratio = np.exp(logp.astype(np.float64) - old_logp)
    clipped = -adv * np.clip(ratio, 1 - clip[0], 1 + clip[1]) > -adv * ratio
    want_clipfrac = clipped[mask].mean() if mask.any() else 0.0
    np.testing.assert_allclose(metrics["clipfrac"], want_clipfrac, atol=1e-6)
    want_kl = (ratio - 1 - np.log(ratio))[mask].mean() if mask.any() else 0.0
    np.testing.assert_allclose(metrics["approx_kl"], want_kl, atol=1e-5)
    for value in metrics.values():
      self.assertTrue(np.isfinite(value))

  def test_gradient_finite_and_zero_at_masked_nan(self):
    logp, old_logp, adv, mask = _policy_batch((4, 10), seed=1)
    grad = jax.grad(lambda l: losses.ppo_clip_loss(
        l, poison(old_logp, mask), poison(adv, mask), mask, dual_clip=3.0)[0])(poison(logp, mask))
    self.assertTrue(np.all(np.isfinite(grad)))
    np.testing.assert_array_equal(np.asarray(grad)[~mask], 0.0)

  def test_on_policy_gradient_is_policy_gradient(self):
    """At ratio 1 nothing is clipped: grad_logp = -A / (number of valid tokens)."""
    _, old_logp, adv, mask = _policy_batch((3, 6), seed=2)
    grad = jax.grad(lambda l: losses.ppo_clip_loss(l, old_logp, adv, mask)[0])(old_logp)
    np.testing.assert_allclose(grad, np.where(mask, -adv / mask.sum(), 0.0), atol=1e-6)

  def test_bad_input_raises(self):
    z = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
      losses.ppo_clip_loss(z, z, z, z, dual_clip=0.5)
    with pytest.raises(ValueError, match="clip_low"):
      losses.ppo_clip_loss(z, z, z, z, clip_low=1.5)
    with pytest.raises(ValueError, match=r"advantages\[2, 4\]"):
      losses.ppo_clip_loss(z, z, jnp.zeros((2, 4)), z)


class GspoTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(shape=SHAPES, clip=[(3e-4, 4e-4), (0.1, 0.2)])
  def test_matches_reference(self, shape, clip):
    logp, old_logp, _, mask = _policy_batch(shape, seed=3)
    logp = (old_logp + 0.05 * (logp - old_logp)).astype(np.float32)
    seq_adv = np.random.default_rng(4).normal(size=shape[0]).astype(np.float32)
    loss, metrics = self.variant(lambda *a: losses.gspo_loss(
        *a, clip_low=clip[0], clip_high=clip[1]))(
        poison(logp, mask), poison(old_logp, mask, np.inf), seq_adv, mask)
    want = reference.gspo(logp, old_logp, seq_adv, mask, *clip)
    np.testing.assert_allclose(loss, want, atol=1e-5)
    self.assertTrue(all(np.isfinite(v) for v in metrics.values()))

  def test_gradient_ignores_masked_nan(self):
    logp, old_logp, _, mask = _policy_batch((4, 8), seed=5)
    grad = jax.grad(lambda l: losses.gspo_loss(
        l, old_logp, jnp.ones(4), mask, clip_low=0.2, clip_high=0.2)[0])(poison(logp, mask))
    self.assertTrue(np.all(np.isfinite(grad)))
    np.testing.assert_array_equal(np.asarray(grad)[~mask], 0.0)


class KlAndDpoTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(kind=losses.KL_KINDS, shape=[(3, 5), (1, 1)])
  def test_kl_matches_reference(self, kind, shape):
    logp, ref_logp, _, _ = _policy_batch(shape, seed=6)
    got = self.variant(lambda a, b: losses.kl_penalty(a, b, kind=kind))(logp, ref_logp)
    np.testing.assert_allclose(got, reference.kl(logp, ref_logp, kind), atol=1e-5)

  def test_kl_unknown_kind(self):
    with pytest.raises(ValueError, match="Unknown KL kind 'k4'; known: k1, k2, k3"):
      losses.kl_penalty(jnp.zeros(2), jnp.zeros(2), kind="k4")

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(0.1, 1.0)
  def test_dpo_matches_reference(self, beta):
    rng = np.random.default_rng(7)
    pc, pr, rc, rr = (-rng.exponential(5.0, size=6).astype(np.float32) for _ in range(4))
    loss, metrics = self.variant(lambda *a: losses.dpo_loss(*a, beta=beta))(pc, pr, rc, rr)
    np.testing.assert_allclose(loss, reference.dpo(pc, pr, rc, rr, beta), atol=1e-5)
    margin = (pc - rc) - (pr - rr)
    np.testing.assert_allclose(metrics["reward_accuracy"], np.mean(margin > 0))
    np.testing.assert_allclose(metrics["margin"], np.mean(margin), atol=1e-4)

  def test_dpo_extreme_margins_finite(self):
    big = jnp.array([1e4, -1e4])
    loss, _ = losses.dpo_loss(big, -big, jnp.zeros(2), jnp.zeros(2), beta=1.0)
    grads = jax.grad(lambda x: losses.dpo_loss(x, -x, jnp.zeros(2), jnp.zeros(2), beta=1.0)[0])(big)
    self.assertTrue(np.isfinite(loss) and np.all(np.isfinite(grads)))
    with pytest.raises(ValueError, match=r"Shapes must match"):
      losses.dpo_loss(jnp.zeros(2), jnp.zeros(3), jnp.zeros(2), jnp.zeros(2))


@given(seed=st.integers(0, 2**16), value=st.sampled_from([np.nan, np.inf, -np.inf, 1e30]))
def test_masked_values_change_nothing(seed, value):
  """Any value at masked positions leaves every loss and its gradient unchanged."""
  logp, old_logp, adv, mask = _policy_batch((4, 7), seed=seed)

  def total(l, o, a):
    ppo = losses.ppo_clip_loss(l, o, a, mask, dual_clip=2.0)[0]
    gspo = losses.gspo_loss(l, o, jnp.arange(4.0), mask, clip_low=0.1, clip_high=0.1)[0]
    return ppo + gspo

  clean = jax.value_and_grad(total, argnums=(0, 1, 2))(logp, old_logp, adv)
  dirty = jax.value_and_grad(total, argnums=(0, 1, 2))(
      poison(logp, mask, value), poison(old_logp, mask, value), poison(adv, mask, value))
  chex.assert_trees_all_close(clean, dirty)
