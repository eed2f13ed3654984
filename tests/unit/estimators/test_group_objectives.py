"""pass@k and maximum-likelihood group advantages against float64 references."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxcredit import estimators
from tests import reference
from tests.conftest import random_rewards

GROUPINGS = [(1, 1), (4, 1), (4, 2), (12, 4), (16, 8)]  # (B, G)


class GroupObjectivesTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(grouping=[(16, 8), (12, 4), (8, 8)], k=[1, 2, 4])
  def test_pass_at_k(self, grouping, k):
    batch, group_size = grouping
    rewards = random_rewards(batch, 2, binary=True)
    rewards[:group_size] = 1.0  # one all-correct group
    got = self.variant(lambda r: estimators.pass_at_k_advantages(r, group_size=group_size, k=k))(
      rewards
    )
    np.testing.assert_allclose(got, reference.pass_at_k(rewards, group_size, k), atol=1e-5)

  def test_pass_at_1_is_grpo_with_population_std(self):
    rewards = random_rewards(16, 3, binary=True)
    grouped = rewards.reshape(-1, 8)
    std = grouped.std(axis=1, keepdims=True)
    want = np.where(
      std > 0, (grouped - grouped.mean(1, keepdims=True)) / np.where(std > 0, std, 1), 0
    )
    np.testing.assert_allclose(
      estimators.pass_at_k_advantages(rewards, group_size=8, k=1), want.reshape(-1), atol=1e-5
    )
    with pytest.raises(ValueError, match=r"k must be an int in \[1, group_size=8\]"):
      estimators.pass_at_k_advantages(rewards, group_size=8, k=9)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(grouping=GROUPINGS, binary=[True, False])
  def test_maxrl_matches_reference(self, grouping, binary):
    batch, group_size = grouping
    rewards = np.abs(random_rewards(batch, seed=5, binary=binary))  # rewards in [0, inf)
    got = self.variant(lambda r: estimators.maxrl_advantages(r, group_size=group_size))(rewards)
    np.testing.assert_allclose(got, reference.maxrl(rewards, group_size), rtol=1e-5, atol=1e-5)

  def test_maxrl_weighs_hard_prompts_more_and_gives_zero_without_success(self):
    rewards = jnp.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                         1.0, 1.0, 1.0, 1.0])
    adv = estimators.maxrl_advantages(rewards, group_size=4)
    # p = 1/4: the success weighs (1 - p) / p = 3; p = 3/4: 1/3. GRPO weighs both alike.
    np.testing.assert_allclose(adv[:8], [3, -1, -1, -1, 1 / 3, 1 / 3, 1 / 3, -1], rtol=1e-6)
    np.testing.assert_array_equal(adv[8:], 0.0)  # no success, and all successes
    np.testing.assert_array_equal(
        estimators.maxrl_advantages(jnp.array([-1.0, -2.0]), group_size=2), 0.0)
    np.testing.assert_array_equal(estimators.maxrl_advantages(rewards, group_size=1), 0.0)
    grad = jax.grad(lambda r: jnp.sum(estimators.maxrl_advantages(r, group_size=4) ** 2))(
        rewards)
    self.assertTrue(np.all(np.isfinite(grad)))
