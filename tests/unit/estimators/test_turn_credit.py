"""Turn-level estimators against float64 references on random multi-turn layouts."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from jaxcredit import estimators
from tests import reference


def _episodes(batch, length, seed, turns=4):
  """Random rows of [prompt] then turns of actions separated by observation spans
  (mask 0); turn ids non-decreasing; anchors from a few states; NaN off the actions."""
  rng = np.random.default_rng(seed)
  mask = np.zeros((batch, length), bool)
  turn_ids = np.full((batch, length), -1, np.int32)
  for b in range(batch):
    t = int(rng.integers(0, 3))
    for k in range(int(rng.integers(0, turns + 1))):  # some rows have no turn at all
      t += int(rng.integers(0, 3))  # the observation before the turn
      n = int(rng.integers(1, 4))
      if t + n > length:
        break
      mask[b, t:t + n], turn_ids[b, t:t + n + 1 if t + n < length else t + n] = True, k
      t += n
  anchors = rng.integers(0, 3, (batch, length)).astype(np.int32)
  turn_rewards = np.where(mask, rng.normal(size=(batch, length)), np.nan).astype(np.float32)
  values = np.where(mask, rng.normal(size=(batch, length)), np.inf).astype(np.float32)
  rewards = rng.integers(0, 2, batch).astype(np.float32)
  return turn_rewards, values, rewards, anchors, turn_ids, mask


class TurnCreditTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(seed=[0, 1, 2], method=list(estimators.RECURRENCE_METHODS))
  def test_turn_gae_matches_reference(self, seed, method):
    turn_rewards, values, _, _, turn_ids, mask = _episodes(6, 24, seed)
    fn = self.variant(lambda r, v, i, m: estimators.turn_gae(r, v, i, m, gamma=0.9, lam=0.7,
                                                              method=method))
    adv, ret = fn(turn_rewards, values, turn_ids, mask)
    want_adv, want_ret = reference.turn_gae(turn_rewards, values, turn_ids, mask, 0.9, 0.7)
    np.testing.assert_allclose(adv, want_adv, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(seed=[0, 1, 2], group_size=[1, 2, 4], scale_by_std=[True, False])
  def test_mt_grpo_matches_reference(self, seed, group_size, scale_by_std):
    turn_rewards, _, rewards, _, turn_ids, mask = _episodes(8, 20, seed)
    fn = self.variant(lambda r, o, i, m: estimators.mt_grpo_advantages(
        r, o, i, m, group_size=group_size, outcome_coef=0.5, scale_by_std=scale_by_std))
    want = reference.mt_grpo(turn_rewards, rewards, turn_ids, mask, group_size, 0.5,
                             scale_by_std=scale_by_std)
    np.testing.assert_allclose(fn(turn_rewards, rewards, turn_ids, mask), want, atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(seed=[0, 1, 2], group_size=[1, 2, 4], scale_by_std=[True, False])
  def test_gigpo_matches_reference(self, seed, group_size, scale_by_std):
    turn_rewards, _, rewards, anchors, turn_ids, mask = _episodes(8, 20, seed)
    fn = self.variant(lambda r, o, a, i, m: estimators.gigpo_advantages(
        r, o, a, i, m, group_size=group_size, step_coef=0.7, gamma=0.9, scale_by_std=scale_by_std))
    want = reference.gigpo(turn_rewards, rewards, anchors, turn_ids, mask, group_size, 0.7, 0.9,
                           scale_by_std=scale_by_std)
    np.testing.assert_allclose(fn(turn_rewards, rewards, anchors, turn_ids, mask), want,
                               atol=1e-5)

  def test_equal_turn_rewards_give_exact_zeros_and_finite_gradients(self):
    mask = np.ones((4, 6), bool)
    turn_ids = np.repeat(np.arange(3), 2)[None].repeat(4, 0).astype(np.int32)
    turn_rewards = np.full((4, 6), 0.1, np.float32)
    rewards = np.zeros(4, np.float32)
    adv = estimators.mt_grpo_advantages(turn_rewards, rewards, turn_ids, mask, group_size=4)
    np.testing.assert_array_equal(adv, 0.0)
    grad = jax.jit(jax.grad(lambda r: jnp.sum(estimators.gigpo_advantages(
        r, rewards, turn_ids, turn_ids, mask, group_size=4) ** 2)))(jnp.asarray(turn_rewards))
    assert np.all(np.isfinite(grad))

  def test_huge_turn_rewards_do_not_overflow(self):
    turn_rewards, _, rewards, anchors, turn_ids, mask = _episodes(8, 20, 0)
    big = np.where(mask, turn_rewards * 1e30, np.nan).astype(np.float32)
    for fn in (estimators.mt_grpo_advantages,
               lambda *a, **k: estimators.gigpo_advantages(a[0], a[1], anchors, *a[2:], **k)):
      got = fn(big, rewards, turn_ids, mask, group_size=4)
      want = fn(np.where(mask, turn_rewards, np.nan), rewards, turn_ids, mask, group_size=4)
      assert np.all(np.isfinite(got))
      np.testing.assert_allclose(got, want, atol=1e-4)  # std-normalised: scale-invariant

  def test_vmap_over_batches(self):
    episodes = [_episodes(4, 12, seed) for seed in range(3)]
    stack = lambda i: np.stack([e[i] for e in episodes])
    got = jax.jit(jax.vmap(
        lambda r, o, i, m: estimators.mt_grpo_advantages(r, o, i, m, group_size=2)))(
        stack(0), stack(2), stack(4), stack(5))
    want = np.stack([reference.mt_grpo(e[0], e[2], e[4], e[5], 2, 1.0) for e in episodes])
    np.testing.assert_allclose(got, want, atol=1e-5)
