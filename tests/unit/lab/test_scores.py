"""Scores of estimator credit against oracle credit vs direct NumPy / SciPy computations."""

import numpy as np
import pytest
from scipy import stats

from jaxcredit.lab import scores
from tests.conftest import random_mask


def _batch(seed=0, shape=(8, 12)):
  rng = np.random.default_rng(seed)
  weights = random_mask(rng, shape)
  oracle = rng.normal(size=shape) * (rng.random(shape) < 0.5) + rng.normal(size=(shape[0], 1))
  est = 0.6 * oracle + rng.normal(size=shape)
  return est, oracle, weights


@pytest.mark.parametrize("seed", range(4))
def test_correlations_against_direct_formulas(seed):
  est, oracle, w = _batch(seed)
  got = scores.correlations(est, oracle, w)
  np.testing.assert_allclose(got["r_pool"].value, np.corrcoef(est[w], oracle[w])[0, 1], atol=1e-10)
  keep = w.any(axis=1)
  demean = lambda x: np.concatenate([x[b][w[b]] - x[b][w[b]].mean() for b in np.flatnonzero(keep)])
  np.testing.assert_allclose(
    got["r_within"].value, np.corrcoef(demean(est), demean(oracle))[0, 1], atol=1e-10
  )
  total = ((oracle[w] - oracle[w].mean()) ** 2).sum()
  between = total - (demean(oracle) ** 2).sum()
  np.testing.assert_allclose(got["eta2"].value, between / total, atol=1e-10)
  rows = [
    np.corrcoef(est[b][w[b]], oracle[b][w[b]])[0, 1]
    for b in np.flatnonzero(keep)
    if w[b].sum() >= 4
  ]
  lengths = [w[b].sum() - 3 for b in np.flatnonzero(keep) if w[b].sum() >= 4]
  np.testing.assert_allclose(
    got["r_row"].value, np.tanh(np.average(np.arctanh(rows), weights=lengths)), atol=1e-10
  )


def test_sequence_level_credit_is_bounded_by_the_ceiling_and_the_row_mean_attains_it():
  est, oracle, w = _batch(5)
  row_mean = np.where(w, ((oracle * w).sum(1) / np.maximum(w.sum(1), 1))[:, None], 0.0)
  best = scores.correlations(row_mean, oracle, w)
  np.testing.assert_allclose(best["r_pool"].value, best["ceiling"].value, atol=1e-10)
  assert best["r2_within"] == scores.Stat(0.0, True, int(w.sum()))
  constant = np.where(w, np.random.default_rng(0).normal(size=(w.shape[0], 1)), 0.0)  # GRPO-like
  got = scores.correlations(constant, oracle, w)
  assert got["r_pool"].value <= got["ceiling"].value + 1e-12 and got["r2_within"].value == 0.0
  assert (
    not got["r_within"].defined and not got["r_row"].defined
  )  # constant rows: undefined, not zero


def test_spearman_matches_scipy_with_ties():
  est, oracle, w = _batch(1)
  est = np.round(est)  # many ties
  want = stats.spearmanr(est[w], oracle[w]).statistic
  np.testing.assert_allclose(scores.spearman(est, oracle, w).value, want, atol=1e-10)


def test_sign_agreement_counts_only_credit_above_noise():
  est, oracle, w = _batch(2)
  se = np.abs(np.random.default_rng(3).normal(size=oracle.shape)) * 0.3
  got = scores.sign_agreement(est, oracle, w, se)
  scope = w & (np.abs(oracle) > np.maximum(0.01, 2 * se))
  agree = np.sign(est[scope]) == np.sign(oracle[scope])
  assert got["sa"] == scores.Stat(agree.mean(), True, int(scope.sum()))
  np.testing.assert_allclose(
    got["sa_weighted"].value, (np.abs(oracle[scope]) * agree).sum() / np.abs(oracle[scope]).sum()
  )


def test_decisive_mass_and_top_k_of_a_uniform_estimator_are_chance():
  shape = (4, 10)
  w = np.ones(shape, bool)
  decisive = np.zeros(shape, bool)
  decisive[:, [2, 7]] = True
  uniform = np.ones(shape)
  assert scores.decisive_mass(uniform, w, decisive).value == pytest.approx(0.2)
  oracle = np.where(decisive, 1.0, 0.0)
  assert scores.decisive_mass(oracle, w, decisive).value == pytest.approx(1.0)
  assert scores.top_k_overlap(uniform, oracle, w, k=2).value == pytest.approx(2 / 10)
  assert scores.top_k_overlap(oracle, oracle, w, k=2).value == pytest.approx(1.0)
  # Ties at the threshold share the remaining places: top-1 of [3, 3, 1] vs top-1 of [1, 0, 0].
  assert scores.top_k_overlap(
    np.array([[3.0, 3.0, 1.0]]), np.array([[1.0, 0.0, 0.0]]), np.ones((1, 3), bool), k=1
  ).value == pytest.approx(0.5)


def test_scale_nmse_is_the_best_non_negative_rescaling():
  est, oracle, w = _batch(4)
  e, o = est[w], oracle[w]
  scale = max(0.0, (e * o).sum() / (e * e).sum())
  want = ((o - scale * e) ** 2).sum() / (o**2).sum()
  np.testing.assert_allclose(scores.scale_nmse(est, oracle, w).value, want, atol=1e-10)
  assert scores.scale_nmse(-oracle, oracle, w).value == pytest.approx(1.0)


def test_degenerate_inputs_are_undefined_never_nan():
  shape = (3, 5)
  nothing = np.zeros(shape, bool)
  zeros = np.zeros(shape)
  out = scores.score(zeros, zeros, nothing, decisive=nothing)
  assert all(not s.defined and s.value == 0.0 for s in out.values())
  out = scores.score(zeros, zeros, np.ones(shape, bool), decisive=nothing)
  assert all(np.isfinite(s.value) for s in out.values())
  assert not out["r_pool"].defined


def test_resampling_noise_against_direct_formulas():
  rng = np.random.default_rng(6)
  oracle = rng.normal(size=(5, 7))
  w = rng.random((5, 7)) < 0.8
  samples = 2.0 * oracle[None] + 0.5 * rng.normal(size=(6, 5, 7))
  got = scores.resampling_noise(samples, oracle, w)
  mean = samples.mean(0)
  scale = (oracle * mean)[w].sum() / (mean**2)[w].sum()
  spread = ((oracle[w] - oracle[w].mean()) ** 2).sum()
  np.testing.assert_allclose(got["rcn"].value, (scale * samples).var(0)[w].sum() / spread)
  np.testing.assert_allclose(
    got["bias_ratio"].value, ((scale * mean - oracle)[w] ** 2).sum() / spread
  )
  steady = scores.resampling_noise(np.repeat(oracle[None], 4, 0), oracle, w)
  assert steady["rcn"].value == 0.0 and steady["bias_ratio"].value == pytest.approx(0.0, abs=1e-12)
  assert not scores.resampling_noise(samples, np.zeros((5, 7)), w)["rcn"].defined
