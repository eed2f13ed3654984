"""Token credit from known state values (VinePPO, the lab's oracles) vs float64 references."""

import chex
import jax
import numpy as np
from absl.testing import parameterized

from jaxcredit import estimators
from tests import reference
from tests.conftest import SHAPES, poison, random_mask


def _inputs(shape, seed):
  rng = np.random.default_rng(seed)
  mask = random_mask(rng, shape)
  values = rng.random(shape).astype(np.float32)
  evaluated = rng.random(shape) < 0.4
  rewards = rng.integers(0, 2, shape[0]).astype(np.float32)
  return values, evaluated, rewards, mask


class ValueCreditTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*SHAPES)
  def test_segment_advantages_match_reference(self, batch, length):
    values, evaluated, rewards, mask = _inputs((batch, length), batch + length)
    got = self.variant(estimators.segment_advantages)(
      poison(values, evaluated & mask), evaluated, rewards, mask
    )
    np.testing.assert_allclose(
      got, reference.segment_advantages(values, evaluated, rewards, mask), atol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*SHAPES)
  def test_every_position_evaluated_is_gae_lambda_zero_and_telescopes(self, batch, length):
    values, _, rewards, mask = _inputs((batch, length), 7 * batch + length)
    got = self.variant(estimators.values_to_advantages)(values, rewards, mask)
    np.testing.assert_allclose(
      got, reference.segment_advantages(values, mask, rewards, mask), atol=1e-6
    )
    np.testing.assert_allclose(
      estimators.segment_advantages(values, mask, rewards, mask), got, atol=1e-6
    )
    # F1: a response's token credits sum to R - V(first action); empty rows sum to 0.
    first = estimators.first_value(values, mask)
    want = np.where(mask.any(axis=1), rewards - first, 0.0)
    np.testing.assert_allclose(np.asarray(got).sum(axis=1), want, atol=1e-5)

  def test_sequence_advantages_broadcast_r_minus_first_value(self):
    values, _, rewards, mask = _inputs((8, 16), 3)
    got = np.asarray(estimators.sequence_advantages(values, rewards, mask))
    for b in range(8):
      valid = np.flatnonzero(mask[b])
      base = values[b, valid[0]] if len(valid) else 0.0
      np.testing.assert_allclose(got[b, valid], rewards[b] - base, atol=1e-6)
      assert (got[b, ~mask[b]] == 0).all()

  def test_vmap_over_a_leading_axis(self):
    stacked = [np.stack(x) for x in zip(*[_inputs((4, 9), s) for s in range(3)])]
    got = jax.vmap(estimators.segment_advantages)(*stacked)
    for i in range(3):
      want = reference.segment_advantages(*(x[i] for x in stacked))
      np.testing.assert_allclose(got[i], want, atol=1e-6)
