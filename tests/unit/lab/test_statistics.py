"""The study's paired statistics against scipy and independent formulations."""

import itertools

import numpy as np
import pytest
import scipy.stats

from jaxcredit.lab import statistics


@pytest.mark.parametrize("n", [3, 6, 10])
def test_sign_flip_p_equals_scipys_exact_paired_permutation_test(n):
  rng = np.random.default_rng(n)
  for shift in (0.0, 0.3, 1.0):
    d = rng.normal(shift, 1.0, n)
    want = scipy.stats.permutation_test((d,), np.mean, permutation_type="samples",
                                        n_resamples=np.inf, alternative="two-sided").pvalue
    np.testing.assert_allclose(statistics.sign_flip_p(d), want, rtol=1e-9)
  assert statistics.sign_flip_p(np.zeros(4)) == 1.0
  assert statistics.sign_flip_p(np.ones(10)) == pytest.approx(2 / 2**10)  # all one sign


def test_sampled_sign_flips_agree_with_the_exact_count():
  d = np.random.default_rng(0).normal(0.4, 1.0, 18)
  exact = np.mean([abs(np.dot(s, d)) >= abs(d.sum()) * (1 - 1e-12)
                   for s in itertools.product((-1, 1), repeat=18)])
  sampled = statistics.sign_flip_p(d, np.random.default_rng(1), draws=200000)
  assert abs(sampled - exact) < 4 * np.sqrt(exact * (1 - exact) / 200000) + 1e-5


def _closed_testing(p):
  """Holm as closed testing with Bonferroni local tests: max over the index sets S that
  hold i of min(1, |S| min_{j in S} p_j)."""
  m = len(p)
  return np.array([max(min(1.0, len(s) * min(p[j] for j in s))
                       for r in range(1, m + 1) for s in itertools.combinations(range(m), r)
                       if i in s) for i in range(m)])


def test_holm_equals_closed_testing_with_bonferroni():
  rng = np.random.default_rng(0)
  for m in (1, 2, 4, 6):
    for _ in range(20):
      p = rng.uniform(0, 0.3, m) ** 2
      np.testing.assert_allclose(statistics.holm(p), _closed_testing(p), rtol=1e-12)
  ties = np.array([0.01, 0.01, 0.04])
  np.testing.assert_allclose(statistics.holm(ties), _closed_testing(ties))


def test_tost_is_equivalence_exactly_when_the_90_percent_interval_is_inside_the_margin():
  rng = np.random.default_rng(0)
  for _ in range(200):
    d = rng.normal(rng.uniform(-0.1, 0.1), rng.uniform(0.01, 0.1), int(rng.integers(3, 12)))
    low, high = scipy.stats.t.interval(0.90, len(d) - 1, loc=d.mean(), scale=scipy.stats.sem(d))
    inside = -0.05 < low and high < 0.05
    assert (statistics.tost(d, 0.05) <= 0.05) == inside, (d, low, high)
  assert statistics.tost([0.01, 0.01, 0.01], 0.05) == 0.0  # no spread, inside
  assert statistics.tost([0.2], 0.05) == 1.0


def test_bootstrap_ci_contains_the_mean_and_a_single_value_is_its_own_interval():
  rng = np.random.default_rng(0)
  mean, low, high = statistics.bootstrap_ci([0.2, 0.4, 0.6, 0.8], rng, 2000)
  assert low < mean < high and mean == pytest.approx(0.5)
  assert statistics.bootstrap_ci([0.5], rng, 100) == (0.5, 0.5, 0.5)


def test_empty_or_non_finite_differences_are_refused():
  for bad in ([], [0.1, np.nan]):
    with pytest.raises(ValueError, match="finite paired differences"):
      statistics.sign_flip_p(bad)
    with pytest.raises(ValueError, match="finite paired differences"):
      statistics.tost(bad, 0.05)


def test_the_slopes_bootstrap_interval_is_that_of_ols_on_each_resample():
  rng = np.random.default_rng(3)
  x, y = np.asarray([2.0, 2.0, 3.0, 3.0, 4.0]), rng.normal(size=5)
  slope, low, high = statistics.ols_slope(x, y, np.random.default_rng(5))
  draws = np.random.default_rng(5).integers(0, 5, (2000, 5))
  slopes = [np.polyfit(x[i], y[i], 1)[0] for i in draws if np.ptp(x[i]) > 0]
  assert len(slopes) < 2000  # some resamples hold one x only and are left out
  np.testing.assert_allclose([slope, low, high],
                             [np.polyfit(x, y, 1)[0], *np.quantile(slopes, [0.025, 0.975])],
                             rtol=1e-9)
