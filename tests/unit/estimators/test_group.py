"""Group baselines against float64 references, plus hypothesis properties."""

import chex
import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxcredit import estimators
from jaxcredit.rollout import Rollout
from tests import reference
from tests.conftest import random_mask, random_rewards

GROUPINGS = [(1, 1), (4, 1), (4, 2), (12, 4), (16, 8)]  # (B, G)


def jc_rollout(mask, rewards, *, group_size):
  """A rollout of `mask`'s shape with `rewards`."""
  return Rollout(tokens=jnp.zeros(mask.shape, jnp.int32), mask=mask, rewards=rewards,
                 group_size=group_size)


class GroupBaselinesTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(grouping=GROUPINGS, scale_by_std=[True, False], binary=[True, False])
  def test_grpo_matches_reference(self, grouping, scale_by_std, binary):
    batch, group_size = grouping
    rewards = random_rewards(batch, binary=binary)
    fn = self.variant(lambda r: estimators.grpo_advantages(
        r, group_size=group_size, scale_by_std=scale_by_std))
    np.testing.assert_allclose(
        fn(rewards), reference.grpo(rewards, group_size, scale_by_std=scale_by_std), atol=1e-5
    )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*GROUPINGS)
  def test_rloo_matches_reference(self, batch, group_size):
    rewards = random_rewards(batch, seed=1)
    got = self.variant(lambda r: estimators.rloo_advantages(r, group_size=group_size))(rewards)
    np.testing.assert_allclose(got, reference.rloo(rewards, group_size), atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(grouping=GROUPINGS, weighted=[True, False])
  def test_gdpo_matches_reference(self, grouping, weighted):
    batch, group_size = grouping
    rng = np.random.default_rng(6)
    components = np.concatenate([rng.integers(0, 2, (batch, 2)), rng.normal(size=(batch, 1))],
                                axis=1).astype(np.float32)
    weights = rng.uniform(0.5, 2.0, 3).astype(np.float32) if weighted else None
    got = self.variant(lambda c: estimators.gdpo_advantages(
        c, group_size=group_size, weights=weights))(components)
    np.testing.assert_allclose(got, reference.gdpo(components, group_size, weights), atol=1e-4)

  def test_gdpo_keeps_reward_combinations_apart_that_grpo_on_their_sum_merges(self):
    # Two groups of two: (1, 1) vs (0, 0), and (1, 0) vs (0, 0). GRPO on the summed reward
    # gives both winners the same advantage; GDPO ranks both components over one.
    components = jnp.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    grpo = estimators.grpo_advantages(components.sum(axis=1), group_size=2)
    self.assertAlmostEqual(float(grpo[0]), float(grpo[2]), places=5)
    gdpo = estimators.gdpo_advantages(components, group_size=2)
    self.assertGreater(float(gdpo[0]), float(gdpo[2]) + 0.5)
    np.testing.assert_allclose(float(jnp.mean(gdpo)), 0.0, atol=1e-6)
    np.testing.assert_array_equal(  # every response alike
        estimators.gdpo_advantages(jnp.ones((4, 2)), group_size=2), 0.0)

  def test_gdpo_refuses_components_and_weights_of_the_wrong_shape(self):
    with self.assertRaisesRegex(ValueError, "components"):
      estimators.gdpo_advantages(jnp.ones(4), group_size=2)
    with self.assertRaisesRegex(ValueError, r"weights must be \[K\] = \[2\]"):
      estimators.gdpo_advantages(jnp.ones((4, 2)), group_size=2, weights=jnp.ones(3))
    with self.assertRaisesRegex(ValueError, "group_size"):
      estimators.gdpo_advantages(jnp.ones((3, 2)), group_size=2)
    rollout = jc_rollout(jnp.ones((4, 3), bool), jnp.array([1.0, 0.0, 1.0, 0.0]), group_size=2)
    with self.assertRaisesRegex(ValueError, "gdpo needs rollout.extras\\['reward_components'\\]"):
      estimators.get("gdpo")(rollout)
    with self.assertRaisesRegex(ValueError, r"shape \[B, K\] with B = 4"):
      estimators.get("gdpo")(rollout.replace(extras={"reward_components": jnp.ones(4)}))

  def test_zero_variance_group_gives_zero_and_finite_grad(self):
    rewards = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    adv = estimators.grpo_advantages(rewards, group_size=4)
    np.testing.assert_array_equal(adv[:4], 0.0)
    grad = jax.grad(lambda r: jnp.sum(estimators.grpo_advantages(r, group_size=4) ** 2))(rewards)
    self.assertTrue(np.all(np.isfinite(grad)))

  def test_vmap_over_batches(self):
    rewards = random_rewards(24, seed=2).reshape(3, 8)
    got = jax.vmap(lambda r: estimators.grpo_advantages(r, group_size=4))(rewards)
    want = np.stack([reference.grpo(r, 4) for r in rewards])
    np.testing.assert_allclose(got, want, atol=1e-5)

  @parameterized.parameters(estimators.grpo_advantages, estimators.rloo_advantages)
  def test_indivisible_batch_raises(self, fn):
    with pytest.raises(ValueError, match="Batch size 6 is not divisible by group_size 4"):
      fn(jnp.zeros(6), group_size=4)
    with pytest.raises(ValueError, match="rank 1"):
      fn(jnp.zeros((2, 4)), group_size=2)

  @chex.variants(with_jit=True, without_jit=True)
  def test_broadcast_and_outcome_to_tokens(self):
    rng = np.random.default_rng(3)
    mask = random_mask(rng, (5, 9))
    values = rng.normal(size=5).astype(np.float32)
    got = self.variant(estimators.broadcast_to_tokens)(values, mask)
    np.testing.assert_array_equal(got, np.where(mask, values[:, None], 0.0))
    placed = np.asarray(self.variant(estimators.outcome_to_tokens)(values, mask))
    for b in range(5):
      want = np.zeros(9, np.float32)
      if mask[b].any():
        want[np.flatnonzero(mask[b])[-1]] = values[b]
      np.testing.assert_array_equal(placed[b], want)

  def test_seq_shape_mismatch_raises(self):
    with pytest.raises(ValueError, match=r"seq_values must have shape \[B\]=\[3\]"):
      estimators.broadcast_to_tokens(jnp.zeros(4), jnp.ones((3, 5)))


_group_sizes = st.sampled_from([2, 3, 4, 8])


@given(
    group_size=_group_sizes,
    n_groups=st.integers(1, 4),
    data=st.data(),
)
def test_grpo_and_rloo_invariant_to_constant_per_group(group_size, n_groups, data):
  batch = group_size * n_groups
  rewards = data.draw(hnp.arrays(np.float32, batch, elements=st.floats(-5, 5, width=32)))
  shift = data.draw(hnp.arrays(np.float32, n_groups, elements=st.floats(-10, 10, width=32)))
  shifted = rewards + np.repeat(shift, group_size)
  # A group's spread must survive the shift's float32 rounding (~1e-6): [0, 1e-7] + 1 is
  # [1, 1 + 1.19e-7], another group as far as eps = 1e-6 is concerned.
  spread = np.ptp(rewards.reshape(n_groups, group_size), axis=1)
  hypothesis.assume(np.all((spread == 0) | (spread >= 1e-2)))
  for fn in (estimators.grpo_advantages, estimators.rloo_advantages):
    a, b = fn(rewards, group_size=group_size), fn(shifted, group_size=group_size)
    np.testing.assert_allclose(a, b, atol=2e-3)


@given(group_size=_group_sizes, scale=st.floats(0.1, 10.0), data=st.data())
def test_grpo_scale_invariant_and_zero_mean(group_size, scale, data):
  rewards = data.draw(hnp.arrays(np.float32, group_size * 2, elements=st.floats(-5, 5, width=32)))
  adv = np.asarray(estimators.grpo_advantages(rewards, group_size=group_size, eps=0.0))
  scaled = np.asarray(estimators.grpo_advantages(rewards * scale, group_size=group_size, eps=0.0))
  assert np.all(np.isfinite(adv))
  np.testing.assert_allclose(adv, scaled, atol=1e-3)
  np.testing.assert_allclose(adv.reshape(-1, group_size).sum(1), 0.0, atol=1e-3)
