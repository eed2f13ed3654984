"""Length-aware group baselines (OPO, lambda-GRPO) against float64 references."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxcredit import estimators
from tests import reference

GROUPINGS = [(1, 1), (4, 1), (4, 2), (12, 4), (16, 8)]  # (B, G)


def _normal(batch, seed):
  return np.random.default_rng(seed).normal(size=batch).astype(np.float32)


class LengthAwareBaselinesTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*GROUPINGS[1:])
  def test_opo(self, batch, group_size):
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=batch).astype(np.float32)
    lengths = rng.integers(0, 5, batch)
    got = self.variant(lambda r, l: estimators.opo_advantages(r, l, group_size=group_size))(
      rewards, lengths
    )
    np.testing.assert_allclose(got, reference.opo(rewards, lengths, group_size), atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(grouping=GROUPINGS, lam_r=[(-3.0, 0.5), (0.5, 2.0), (2.0, 1.0)])
  def test_lambda_grpo_matches_reference(self, grouping, lam_r):
    (batch, group_size), (lam, r) = grouping, lam_r
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 30, batch)
    lengths[:group_size] = 5  # a group of equal lengths
    rewards = _normal(batch, seed=8)
    weights = self.variant(lambda l, lam: estimators.lambda_grpo_weights(
        l, group_size=group_size, lam=lam, r=r))(lengths, lam)
    want = reference.lambda_grpo_weights(lengths, group_size, lam, r)
    np.testing.assert_allclose(weights, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(weights.reshape(-1, group_size).mean(1), 1.0, rtol=1e-5)
    advantages = self.variant(lambda x, l: estimators.lambda_grpo_advantages(
        x, l, group_size=group_size, lam=lam, r=r))(rewards, lengths)
    np.testing.assert_allclose(advantages, want * reference.grpo(rewards, group_size),
                               rtol=1e-4, atol=1e-5)

  def test_lambda_grpo_at_lam_0_is_grpo_and_stays_finite_at_any_lam(self):
    rewards, lengths = _normal(16, seed=9), np.random.default_rng(9).integers(0, 50, 16)
    np.testing.assert_allclose(
        estimators.lambda_grpo_advantages(rewards, lengths, group_size=8, lam=0.0),
        estimators.grpo_advantages(rewards, group_size=8), rtol=1e-6)
    for lam in (-1e4, -50.0, 50.0, 1e4):  # h clipped at h_min, the exponent capped
      weights = estimators.lambda_grpo_weights(lengths, group_size=8, lam=lam, r=3.0)
      assert np.all(np.isfinite(weights)), lam
      np.testing.assert_allclose(weights.reshape(2, 8).sum(1), 8.0, rtol=1e-5)
    longest = np.argmax(lengths[:8])  # lam >> 0 puts a group's weight on its longest response
    assert estimators.lambda_grpo_weights(lengths, group_size=8, lam=50.0)[longest] > 7.0
    with pytest.raises(ValueError, match="h_min"):
      estimators.lambda_grpo_weights(lengths, group_size=8, lam=1.0, h_min=0.0)
    with pytest.raises(ValueError, match="group_size"):
      estimators.lambda_grpo_weights(lengths, group_size=5, lam=1.0)

  def test_lambda_grpo_weights_are_differentiable_in_lam_and_vmap_over_it(self):
    lengths, rewards = np.array([3, 9, 4, 4, 0, 12, 7, 1]), _normal(8, seed=10)
    fn = lambda lam: estimators.lambda_grpo_advantages(rewards, lengths, group_size=4,
                                                       lam=lam).sum()
    for lam in (-2.0, 0.5, 3.0):
      step = 1e-4  # central difference of the float64 reference
      want = (np.sum(reference.lambda_grpo_weights(lengths, 4, lam + step)
                     * reference.grpo(rewards, 4))
              - np.sum(reference.lambda_grpo_weights(lengths, 4, lam - step)
                       * reference.grpo(rewards, 4))) / (2 * step)
      np.testing.assert_allclose(jax.grad(fn)(lam), want, rtol=1e-3, atol=1e-5)
    lams = jnp.array([-1.0, 0.0, 2.0])
    batched = jax.vmap(lambda lam: estimators.lambda_grpo_weights(lengths, group_size=4,
                                                                  lam=lam))(lams)
    for row, lam in zip(batched, lams):
      np.testing.assert_allclose(row, reference.lambda_grpo_weights(lengths, 4, float(lam)),
                                 rtol=1e-5)
