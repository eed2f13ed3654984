"""discounted_returns and gae against float64 loops, with masking properties."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from absl.testing import parameterized

from jaxcredit import estimators
from tests import reference
from tests.conftest import SHAPES, poison, random_mask

ATOL = 1e-4


class DiscountedReturnsTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(shape=SHAPES, gamma=[1.0, 0.9])
  def test_matches_reference(self, shape, gamma):
    rng = np.random.default_rng(0)
    mask = random_mask(rng, shape)
    rewards = rng.normal(size=shape).astype(np.float32)
    fn = self.variant(lambda r, m: estimators.discounted_returns(r, m, gamma=gamma))
    got = fn(poison(rewards, mask), mask)
    np.testing.assert_allclose(got, reference.discounted_returns(rewards, mask, gamma), atol=ATOL)
    self.assertTrue(np.all(np.asarray(got)[~mask] == 0.0))


class GaeTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(shape=SHAPES, gamma_lam=[(1.0, 1.0), (0.99, 0.95), (0.5, 0.0)])
  def test_matches_reference(self, shape, gamma_lam):
    gamma, lam = gamma_lam
    rng = np.random.default_rng(1)
    mask = random_mask(rng, shape)
    rewards = rng.normal(size=shape).astype(np.float32)
    values = rng.normal(size=shape).astype(np.float32)
    fn = self.variant(lambda r, v, m: estimators.gae(r, v, m, gamma=gamma, lam=lam))
    adv, ret = fn(poison(rewards, mask), poison(values, mask, np.inf), mask)
    want_adv, want_ret = reference.gae(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, atol=ATOL)
    np.testing.assert_allclose(ret, want_ret, atol=ATOL)

  def test_lambda_one_zero_values_is_discounted_return(self):
    rng = np.random.default_rng(2)
    mask = random_mask(rng, (4, 9))
    rewards = rng.normal(size=(4, 9)).astype(np.float32)
    adv, _ = estimators.gae(rewards, np.zeros_like(rewards), mask, gamma=0.9, lam=1.0)
    np.testing.assert_allclose(
        adv, estimators.discounted_returns(rewards, mask, gamma=0.9), atol=1e-5
    )

  def test_vmap_over_rows_equals_batch(self):
    rng = np.random.default_rng(3)
    mask = random_mask(rng, (6, 10))
    rewards, values = rng.normal(size=(2, 6, 10)).astype(np.float32)
    batched = estimators.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    per_row = jax.vmap(
        lambda r, v, m: estimators.gae(r[None], v[None], m[None], gamma=0.9, lam=0.8)
    )(rewards, values, mask)
    chex.assert_trees_all_close(batched, jax.tree.map(lambda x: x[:, 0], per_row), atol=1e-6)

  def test_gradient_ignores_nan_at_masked_positions(self):
    rng = np.random.default_rng(4)
    mask = random_mask(rng, (4, 12))
    values = poison(rng.normal(size=(4, 12)).astype(np.float32), mask)
    rewards = rng.normal(size=(4, 12)).astype(np.float32)
    grad = jax.grad(
        lambda v: jnp.sum(estimators.gae(rewards, v, mask, gamma=0.9, lam=0.9)[0] ** 2)
    )(jnp.asarray(values))
    self.assertTrue(np.all(np.isfinite(grad)))
    self.assertTrue(np.all(np.asarray(grad)[~mask] == 0.0))

  @parameterized.parameters(*estimators.RECURRENCE_METHODS)
  def test_methods_agree(self, method):
    rng = np.random.default_rng(5)
    mask = random_mask(rng, (6, 40))
    rewards, values = rng.normal(size=(2, 6, 40)).astype(np.float32)
    got = estimators.gae(poison(rewards, mask), poison(values, mask), mask,
                         gamma=0.99, lam=0.9, method=method)
    want = reference.gae(rewards, values, mask, 0.99, 0.9)
    chex.assert_trees_all_close(got, want, atol=1e-4)
    np.testing.assert_allclose(
        estimators.discounted_returns(poison(rewards, mask), mask, gamma=0.9, method=method),
        reference.discounted_returns(rewards, mask, 0.9), atol=1e-4)

  @parameterized.parameters(
      dict(gamma=1.0, lam=1.0, length=1000),   # blocks of 32, a length they do not divide
      dict(gamma=0.99, lam=0.95, length=64),
      dict(gamma=0.5, lam=0.2, length=77),     # g = 0.1: blocks of 16 keep g^-K in range
      dict(gamma=0.1, lam=0.1, length=50),     # g = 0.01: blocks of 8
      dict(gamma=1e-10, lam=1e-10, length=9),  # too small for any block: runs the scan
      dict(gamma=0.9, lam=0.0, length=20),     # g = 0: no block, the scan
      dict(gamma=1.0, lam=1.0, length=2100),   # blocks of blocks of blocks (3 levels)
      dict(gamma=1.0, lam=0.95, length=3000),  # 2 levels (g^-1024 in range), then a scan
      dict(gamma=0.8, lam=1.0, length=700),    # second level in blocks of 8, then a scan
  )
  def test_blocked_equals_float64_reference(self, gamma, lam, length):
    """The blocked recurrence (products of valid-count powers within blocks) is exact
    for every discount, long holes and fully masked rows included."""
    rng = np.random.default_rng(11)
    mask = random_mask(rng, (5, length))
    mask[1] = False
    mask[2, length // 4: length // 2] = False  # a hole longer than a block
    rewards, values = (rng.normal(size=(2, 5, length)) * 3).astype(np.float32)
    got = jax.jit(lambda r, v: estimators.gae(r, v, mask, gamma=gamma, lam=lam, method="blocked"))(
        poison(rewards, mask), poison(values, mask))
    want = reference.gae(rewards, values, mask, gamma, lam)
    scale = max(1.0, float(np.max(np.abs(want[0]))))
    chex.assert_trees_all_close(got, want, atol=2e-5 * scale, rtol=1e-5)
    grad, want_grad = jax.jit(lambda v: [jax.grad(lambda v: jnp.sum(estimators.gae(
        rewards, v, mask, gamma=gamma, lam=lam, method=method)[0] ** 2))(v)
        for method in ("blocked", "scan")])(values)
    np.testing.assert_allclose(grad, want_grad, atol=1e-4 * scale ** 2, rtol=1e-4)

  def test_bad_shapes_raise(self):
    with pytest.raises(ValueError, match=r"values\[3, 4\]"):
      estimators.gae(jnp.zeros((2, 4)), jnp.zeros((3, 4)), jnp.ones((2, 4)), gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match="rank 2"):
      estimators.discounted_returns(jnp.zeros(4), jnp.ones(4), gamma=1.0)
    with pytest.raises(ValueError, match="n must be a positive int"):
      estimators.n_step_returns(jnp.zeros((2, 4)), jnp.zeros((2, 4)), jnp.ones((2, 4)), n=0,
                                gamma=1.0)
    with pytest.raises(ValueError, match=r"log_rhos\[2, 5\]"):
      estimators.vtrace(
        jnp.zeros((2, 4)), jnp.zeros((2, 4)), jnp.ones((2, 4)), jnp.zeros((2, 5)), gamma=1.0
      )
    with pytest.raises(ValueError, match="Unknown recurrence method 'fast'"):
      estimators.gae(
        jnp.zeros((2, 4)), jnp.zeros((2, 4)), jnp.ones((2, 4)), gamma=1.0, lam=1.0, method="fast"
      )


class ClassicalEstimatorsTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(
    shape=SHAPES, gamma_lam=[(1.0, 1.0), (0.9, 0.5), (0.99, 0.0)],
    method=estimators.RECURRENCE_METHODS)
  def test_lambda_returns(self, shape, gamma_lam, method):
    gamma, lam = gamma_lam
    rng = np.random.default_rng(6)
    mask = random_mask(rng, shape)
    rewards, values = rng.normal(size=(2, *shape)).astype(np.float32)
    got = self.variant(
      lambda r, v, m: estimators.lambda_returns(r, v, m, gamma=gamma, lam=lam, method=method)
    )(poison(rewards, mask), poison(values, mask), mask)
    np.testing.assert_allclose(
      got, reference.lambda_returns(rewards, values, mask, gamma, lam), atol=1e-4
    )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(shape=SHAPES, n=[1, 3, 40], method=estimators.RECURRENCE_METHODS)  # 40 > T
  def test_n_step_returns(self, shape, n, method):
    rng = np.random.default_rng(7)
    mask = random_mask(rng, shape)
    rewards, values = rng.normal(size=(2, *shape)).astype(np.float32)
    got = self.variant(
      lambda r, v, m: estimators.n_step_returns(r, v, m, n=n, gamma=0.9, method=method)
    )(poison(rewards, mask), poison(values, mask), mask)
    np.testing.assert_allclose(
      got, reference.n_step_returns(rewards, values, mask, n, 0.9), atol=1e-4
    )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(
    shape=SHAPES, lam=[1.0, 0.8], clips=[(1.0, 1.0), (2.0, 0.5)],
    method=estimators.RECURRENCE_METHODS)
  def test_vtrace(self, shape, lam, clips, method):
    rng = np.random.default_rng(8)
    mask = random_mask(rng, shape)
    rewards, values = rng.normal(size=(2, *shape)).astype(np.float32)
    log_rhos = (0.5 * rng.normal(size=shape)).astype(np.float32)
    got = self.variant(
      lambda r, v, m, lr: estimators.vtrace(
        r, v, m, lr, gamma=0.95, lam=lam, clip_rho=clips[0], clip_c=clips[1], method=method
      )
    )(poison(rewards, mask), poison(values, mask), mask, poison(log_rhos, mask, np.inf))
    want = reference.vtrace(rewards, values, mask, log_rhos, 0.95, lam, *clips)
    chex.assert_trees_all_close(got, want, atol=1e-4)

  def test_vtrace_on_policy_is_lambda_return(self):
    """With rho = c = 1 (on-policy, no clipping), vs equals the TD(lambda) return."""
    rng = np.random.default_rng(9)
    mask = random_mask(rng, (4, 12))
    rewards, values = rng.normal(size=(2, 4, 12)).astype(np.float32)
    vs, _ = estimators.vtrace(rewards, values, mask, np.zeros_like(rewards), gamma=0.9, lam=0.7)
    np.testing.assert_allclose(
      vs, estimators.lambda_returns(rewards, values, mask, gamma=0.9, lam=0.7), atol=1e-5
    )


@jax.jit
def _poison_grads(rewards, values, mask):
  """Gradients of GAE's and the discounted returns' outputs, and GAE's outputs."""
  def total(r, v):
    adv, ret = estimators.gae(r, v, mask, gamma=0.9, lam=0.7)
    return jnp.sum(adv**2 + ret + estimators.discounted_returns(r, mask, gamma=0.8)), (adv, ret)

  return jax.grad(total, argnums=(0, 1), has_aux=True)(rewards, values)


@given(
  shape=st.sampled_from(SHAPES),  # few shapes: the gradients compile once per shape
  seed=st.integers(0, 2**16),
  value=st.sampled_from([np.nan, np.inf, -np.inf]),
)
def test_masked_values_change_nothing(shape, seed, value):
  """Poisoning masked rewards/values changes neither outputs nor gradients; outputs there are 0."""
  rng = np.random.default_rng(seed)
  mask = random_mask(rng, shape)
  rewards, values = rng.normal(size=(2, *shape)).astype(np.float32)

  clean = _poison_grads(rewards, values, mask)
  dirty = _poison_grads(poison(rewards, mask, value), poison(values, mask, value), mask)
  chex.assert_trees_all_close(clean, dirty)
  assert all(np.all(np.asarray(x)[~mask] == 0.0) for x in jax.tree.leaves(dirty))
