"""Group/sequence baselines of Core II and the token-credit helpers vs references."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given
from hypothesis import strategies as st

from jaxcredit import estimators, logprobs
from tests import reference
from tests.conftest import SHAPES, poison, random_mask

GROUPINGS = [(4, 1), (4, 2), (12, 4), (16, 8)]


def _binary(batch, seed):
  return np.random.default_rng(seed).integers(0, 2, batch).astype(np.float32)


class SequenceBaselinesTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*GROUPINGS, (1, 1))
  def test_grpo_batch_std(self, batch, group_size):
    rewards = _binary(batch, 0)
    got = self.variant(lambda r: estimators.grpo_batch_std_advantages(r, group_size=group_size))(
      rewards
    )
    np.testing.assert_allclose(got, reference.grpo_batch_std(rewards, group_size), atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(grouping=GROUPINGS, scale_by_std=[False, True])
  def test_gpg(self, grouping, scale_by_std):
    batch, group_size = grouping
    rewards = _binary(batch, 4)
    rewards[:group_size] = 0.0  # a degenerate group
    got = self.variant(
      lambda r: estimators.gpg_advantages(r, group_size=group_size, scale_by_std=scale_by_std)
    )(rewards)
    np.testing.assert_allclose(got, reference.gpg(rewards, group_size, scale_by_std), atol=1e-5)

  def test_remax(self):
    rewards, baseline = np.arange(4.0), np.array([1.0, 1.0, 0.0, 5.0])
    np.testing.assert_allclose(estimators.remax_advantages(rewards, baseline), rewards - baseline)
    with pytest.raises(ValueError, match=r"baseline_rewards\[3\]"):
      estimators.remax_advantages(jnp.zeros(4), jnp.zeros(3))


class TokenCreditTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(shape=SHAPES, shift_mean=[True, False])
  def test_whiten(self, shape, shift_mean):
    rng = np.random.default_rng(5)
    mask = random_mask(rng, shape)
    x = (3 + 2 * rng.normal(size=shape)).astype(np.float32)
    got = self.variant(lambda x, m: estimators.whiten(x, m, shift_mean=shift_mean))(
      poison(x, mask), mask
    )
    np.testing.assert_allclose(got, reference.whiten(x, mask, shift_mean), atol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(form=["sum", "min"], temperature=[0.1, 1.0])
  def test_prm_token_rewards(self, form, temperature):
    rng = np.random.default_rng(6)
    mask = random_mask(rng, (4, 12), holes=False)
    scores = rng.random((4, 3)).astype(np.float32)
    ends = rng.integers(-1, 13, (4, 3))
    step_mask = rng.random((4, 3)) > 0.2
    got = self.variant(
      lambda s, e, m, sm: estimators.prm_token_rewards(
        s, e, m, step_mask=sm, form=form, temperature=temperature
      )
    )(scores, ends, mask, step_mask)
    want = reference.prm_token_rewards(scores, ends, step_mask, mask, form, temperature)
    np.testing.assert_allclose(got, want, atol=1e-5)

  def test_min_form_return_approaches_min_step_score(self):
    scores = np.array([[0.9, 0.2, 0.8, 0.7]], np.float32)
    ends = np.array([[1, 3, 5, 7]])
    mask = np.ones((1, 8), bool)
    placed = estimators.prm_token_rewards(scores, ends, mask, form="min", temperature=0.01)
    np.testing.assert_allclose(
      estimators.discounted_returns(placed, mask, gamma=1.0)[0, 0], 0.2, atol=1e-3
    )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters((8, 2), (8, 4), (4, 1))
  def test_optimal_token_baseline(self, batch, group_size):
    rng = np.random.default_rng(7)
    mask = random_mask(rng, (batch, 9))
    returns = rng.normal(size=(batch, 9)).astype(np.float32)
    logits = rng.normal(size=(batch, 9, 11)).astype(np.float32)
    tokens = rng.integers(0, 11, (batch, 9))
    logp = np.asarray(logprobs.token_logprobs(logits, tokens))
    sum_sq = np.asarray(logprobs.token_sum_probs_squared(logits))
    np.testing.assert_allclose(
      sum_sq, (np.exp(reference.log_softmax(logits)) ** 2).sum(-1), atol=1e-6
    )
    got = self.variant(
      lambda *a: estimators.optimal_token_baseline_advantages(*a, group_size=group_size)
    )(poison(returns, mask), poison(logp, mask), poison(sum_sq, mask), mask)
    want = reference.optimal_token_baseline(returns, logp, sum_sq, mask, group_size)
    np.testing.assert_allclose(got, want, atol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(0.1, 0.2, 0.5, 1.0)
  def test_high_entropy_mask(self, rho):
    rng = np.random.default_rng(8)
    mask = random_mask(rng, (6, 20))
    entropy = rng.random((6, 20)).astype(np.float32)
    got = np.asarray(
      self.variant(lambda e, m: estimators.high_entropy_mask(e, m, rho=rho))(
        poison(entropy, mask), mask
      )
    )
    n_keep = int(np.ceil(rho * mask.sum()))
    threshold = np.sort(entropy[mask])[::-1][n_keep - 1]
    np.testing.assert_array_equal(got, mask & (entropy >= threshold))
    with pytest.raises(ValueError, match=r"rho must be in \(0, 1\]"):
      estimators.high_entropy_mask(entropy, mask, rho=0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_surprisal_and_implicit_rewards(self):
    rng = np.random.default_rng(9)
    mask = random_mask(rng, (5, 8))
    logp = -rng.exponential(size=(5, 8)).astype(np.float32)
    ref_logp = -rng.exponential(size=(5, 8)).astype(np.float32)
    weights = np.asarray(self.variant(estimators.surprisal_weights)(poison(logp, mask), mask))
    np.testing.assert_allclose(weights, np.where(mask, -logp / (-logp[mask]).mean(), 0), rtol=1e-5)
    np.testing.assert_allclose(weights[mask].mean(), 1.0, rtol=1e-5)
    implicit = self.variant(lambda a, b, m: estimators.implicit_process_rewards(a, b, m, beta=0.1))(
      poison(logp, mask), ref_logp, mask
    )
    np.testing.assert_allclose(implicit, np.where(mask, 0.1 * (logp - ref_logp), 0), atol=1e-6)


@given(seed=st.integers(0, 2**16), shift=st.floats(-10, 10), scale=st.floats(0.1, 10))
def test_whiten_is_shift_and_scale_invariant(seed, shift, scale):
  rng = np.random.default_rng(seed)
  mask = random_mask(rng, (3, 6))
  x = rng.normal(size=(3, 6)).astype(np.float32)
  a = estimators.whiten(x, mask, eps=0.0)
  b = estimators.whiten(x * scale + shift, mask, eps=0.0)
  assert np.all(np.isfinite(a))
  np.testing.assert_allclose(a, b, atol=2e-3)
