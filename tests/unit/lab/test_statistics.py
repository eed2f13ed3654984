"""The study's paired statistics against scipy and independent formulations."""

import itertools
import math

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


@pytest.mark.parametrize("alternative", ["greater", "less"])
def test_one_sided_sign_flip_p_equals_scipys_exact_paired_permutation_test(alternative):
  rng = np.random.default_rng(1)
  for n in (3, 7, 11):
    for shift in (-0.5, 0.0, 0.8):
      d = rng.normal(shift, 1.0, n)
      want = scipy.stats.permutation_test((d,), np.mean, permutation_type="samples",
                                          n_resamples=np.inf, alternative=alternative).pvalue
      np.testing.assert_allclose(statistics.sign_flip_p(d, alternative=alternative), want,
                                 rtol=1e-9)
  assert statistics.sign_flip_p(np.ones(10), alternative="greater") == pytest.approx(2**-10)
  assert statistics.sign_flip_p(np.ones(10), alternative="less") == 1.0
  with pytest.raises(ValueError, match="Unknown alternative 'bigger'"):
    statistics.sign_flip_p([1.0], alternative="bigger")


def test_tost_is_the_larger_of_two_one_sided_permutation_tests_at_the_margins():
  rng = np.random.default_rng(0)
  for _ in range(40):
    d = rng.normal(rng.uniform(-0.1, 0.1), rng.uniform(0.01, 0.1), int(rng.integers(3, 12)))
    exact = lambda x, alternative: scipy.stats.permutation_test(
        (x,), np.mean, permutation_type="samples", n_resamples=np.inf,
        alternative=alternative).pvalue
    want = max(exact(d + 0.05, "greater"), exact(d - 0.05, "less"))
    np.testing.assert_allclose(statistics.tost(d, 0.05), want, rtol=1e-9)
  # Inside the margin with every value: the smallest p of n values, 2^-n; a mean beyond it
  # is never shown equivalent.
  assert statistics.tost([0.01, -0.01, 0.0, 0.02, 0.01], 0.05) == pytest.approx(2**-5)
  assert statistics.tost([0.2, 0.21, 0.19, 0.2, 0.22, 0.18], 0.05) == 1.0
  assert statistics.tost([0.2], 0.05) == 1.0
  with pytest.raises(ValueError, match="margin > 0"):
    statistics.tost([0.1, 0.2], 0.0)


def _bca_reference(values, draws, rng):
  """BCa (Efron 1987) from its formulas in float64: the bias correction z0 from the share
  of resampled means below the mean, the acceleration from the jackknife's skew."""
  values = np.asarray(values, np.float64)
  n, mean = len(values), values.mean()
  means = values[rng.integers(0, n, (draws, n))].mean(axis=1)
  z0 = scipy.stats.norm.ppf(np.mean(means < mean))
  jack = (values.sum() - values) / (n - 1)
  a = np.sum((jack.mean() - jack)**3) / (6 * np.sum((jack.mean() - jack)**2)**1.5)
  z = scipy.stats.norm.ppf([0.025, 0.975])
  levels = scipy.stats.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
  return np.quantile(means, levels)


def test_bca_intervals_follow_efrons_formulas_and_shift_toward_the_skew():
  rng = np.random.default_rng(4)
  for values in (rng.exponential(1.0, 10), rng.normal(0.0, 1.0, 12), -rng.exponential(1.0, 8)):
    mean, low, high = statistics.bootstrap_ci(values, np.random.default_rng(0), 100_000, "BCa")
    assert mean == pytest.approx(values.mean())
    np.testing.assert_allclose([low, high],
                               _bca_reference(values, 400_000, np.random.default_rng(1)),
                               atol=0.02 * np.std(values))
  skewed = rng.exponential(1.0, 10)  # a long right tail: BCa moves both ends up
  _, low_p, high_p = statistics.bootstrap_ci(skewed, np.random.default_rng(0), 50_000)
  _, low_b, high_b = statistics.bootstrap_ci(skewed, np.random.default_rng(0), 50_000, "BCa")
  assert low_b > low_p and high_b > high_p
  assert statistics.bootstrap_ci([0.3] * 6, rng, 100, "BCa") == (0.3, 0.3, 0.3)
  assert statistics.reported_ci([0.1, 0.2], rng, 100, "BCa") == (pytest.approx(0.15), None, None)
  with pytest.raises(ValueError, match="Unknown interval method 'bca'"):
    statistics.bootstrap_ci([0.1, 0.2], rng, 100, "bca")


def test_slope_p_agrees_with_scipys_pairings_permutation_test():
  rng = np.random.default_rng(2)
  x = np.repeat([2.0, 3.0, 4.0, 5.0], 5)
  slope = lambda y_, axis=-1: np.sum((x - x.mean()) * (y_ - y_.mean(axis, keepdims=True)), axis)
  for trend in (0.0, 0.05, 0.3):
    y = trend * x + rng.normal(0, 0.3, x.size)
    want = scipy.stats.permutation_test((y,), slope, permutation_type="pairings",
                                        vectorized=True, n_resamples=99_999,
                                        rng=np.random.default_rng(3)).pvalue
    got = statistics.slope_p(x, y, np.random.default_rng(4), draws=99_999)
    assert abs(got - want) < 4 * np.sqrt(want * (1 - want) / 99_999) + 2e-5, (trend, got, want)
  with pytest.raises(ValueError, match="x not constant"):
    statistics.slope_p([1.0, 1.0], [0.0, 1.0], rng)


@pytest.mark.parametrize("delta, p, p_equivalence, at_ceiling, want", [
    ((0.2, 0.1, 0.3), 0.01, 1.0, False, "higher"),
    ((-0.2, -0.3, -0.1), 0.01, 1.0, False, "lower"),
    # Significant and inside the margin, or shown inside it: negligible either way.
    ((-0.001, -0.002, -0.001), 0.004, 0.001, False, "negligible"),
    ((0.005, 0.004, 0.006), 0.01, 1.0, False, "negligible"),
    ((0.01, -0.02, 0.03), 0.6, 0.01, False, "negligible"),
    # An interval that allows a difference beyond the margin, however small the mean.
    ((0.01, -0.2, 0.19), 0.6, 0.4, False, "inconclusive"),
    ((0.19, -0.02, 0.41), 0.2, 0.8, False, "inconclusive"),
    ((0.007, -0.001, 0.02), 0.4, 0.01, True, "ceiling"),
    ((0.3, None, None), 0.0, 0.0, False, "n/a"),
])
def test_a_verdict_reads_the_margin_before_significance(delta, p, p_equivalence, at_ceiling,
                                                        want):
  assert statistics.verdict(delta, p, p_equivalence, 0.05, at_ceiling=at_ceiling) == want


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


def _split_p(first, second):
  """Two-sided permutation p by enumerating every split of the pooled values."""
  pooled = np.concatenate([first, second])
  observed = abs(first.mean() - second.mean())
  extreme = []
  for chosen in itertools.combinations(range(len(pooled)), len(first)):
    inside = np.zeros(len(pooled), bool)
    inside[list(chosen)] = True
    extreme.append(abs(pooled[inside].mean() - pooled[~inside].mean()) >= observed * (1 - 1e-12))
  return np.mean(extreme)


@pytest.mark.parametrize("sizes", [(3, 3), (5, 4), (6, 6)])
def test_unpaired_p_equals_enumerating_every_split(sizes):
  rng = np.random.default_rng(sum(sizes))
  for shift in (0.0, 0.5, 2.0):
    first, second = rng.normal(shift, 1.0, sizes[0]), rng.normal(0.0, 2.0, sizes[1])
    np.testing.assert_allclose(statistics.unpaired_p(first, second),
                               _split_p(first, second), rtol=1e-9)
  assert statistics.unpaired_p([0.5, 0.5], [0.5, 0.5, 0.5]) == 1.0


def test_sampled_unpaired_p_agrees_with_the_exact_count():
  rng = np.random.default_rng(3)
  first, second = rng.normal(0.6, 1.0, 10), rng.normal(0.0, 1.0, 10)  # C(20, 10) > 2^16
  sampled = statistics.unpaired_p(first, second, np.random.default_rng(1), draws=100000)
  exact = _split_p(first, second)
  assert abs(sampled - exact) < 4 * np.sqrt(exact * (1 - exact) / 100000) + 1e-4


def _welch(first, second):
  """Welch's interval written out: Welch-Satterthwaite degrees of freedom."""
  v1, v2 = first.var(ddof=1) / len(first), second.var(ddof=1) / len(second)
  nu = (v1 + v2) ** 2 / (v1**2 / (len(first) - 1) + v2**2 / (len(second) - 1))
  d = first.mean() - second.mean()
  half = scipy.stats.t.ppf(0.975, nu) * math.sqrt(v1 + v2)
  return d, d - half, d + half


def test_welch_ci_equals_the_welch_satterthwaite_formula():
  rng = np.random.default_rng(0)
  for n1, n2 in ((2, 2), (5, 9), (10, 10)):
    first, second = rng.normal(0.3, 0.5, n1), rng.normal(0.0, 2.0, n2)
    np.testing.assert_allclose(statistics.welch_ci(first, second), _welch(first, second),
                               rtol=1e-9)
  assert statistics.welch_ci([1.0, 1.0], [0.25, 0.25, 0.25]) == (0.75, 0.75, 0.75)
  with pytest.raises(ValueError, match="at least 2 values"):
    statistics.welch_ci([1.0], [0.0, 1.0])
  with pytest.raises(ValueError, match="finite"):
    statistics.unpaired_p([np.nan, 1.0], [0.0])
