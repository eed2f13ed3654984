"""Paired comparisons over seeds, as the lab's studies report them.

  sign_flip_p(differences)            exact two-sided p of "mean difference = 0"
  holm(p_values)                      Holm step-down adjusted p-values (family-wise error)
  tost(differences, margin)           two one-sided t-tests: equivalence within +-margin
  bootstrap_ci(values, rng, draws)    mean and 95% percentile-bootstrap interval
  reported_ci(values, rng, draws)     the same, or no interval below MIN_SEEDS values
  ols_slope(x, y, rng)                OLS slope with a 95% bootstrap interval over the pairs

Every difference is paired by seed (the same initialisation, prompts and sampling keys), so
the tests are one-sample tests of the per-seed differences.
"""

import itertools

import numpy as np
import scipy.stats

MIN_SEEDS = 5  # fewer seeds: a bootstrap interval is little more than their range
EXACT_FLIPS = 16  # up to 2^16 sign patterns enumerated; more are sampled


def sign_flip_p(differences, rng: np.random.Generator | None = None, draws: int = 65536) -> float:
  """Two-sided p-value of H0 "the paired differences are symmetric about 0" (a sign-flip
  permutation test of their mean): the fraction of sign patterns s in {-1, 1}^n with
  |mean(s d)| >= |mean(d)|. Exact (all 2^n patterns) for n <= EXACT_FLIPS, else `draws`
  random patterns from `rng` (the observed one counted). 1.0 when every difference is 0."""
  d = _nonempty(differences)
  if not np.any(d):
    return 1.0
  observed = abs(d.mean()) * (1 - 1e-12)  # ties count as at least as extreme
  if d.size <= EXACT_FLIPS:
    signs = np.asarray(list(itertools.product((-1.0, 1.0), repeat=d.size)))
    return float(np.mean(np.abs(signs @ d) / d.size >= observed))
  rng = rng or np.random.default_rng(0)
  signs = rng.choice((-1.0, 1.0), (draws, d.size))
  return float((1 + np.sum(np.abs(signs @ d) / d.size >= observed)) / (draws + 1))


def holm(p_values) -> np.ndarray:
  """Holm's step-down adjusted p-values: with p_(1) <= ... <= p_(m),
  p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)). Rejecting p~ <= alpha controls the
  family-wise error rate at alpha."""
  p = np.asarray(p_values, np.float64)
  order = np.argsort(p, kind="stable")
  scaled = np.minimum(1.0, (len(p) - np.arange(len(p))) * p[order])
  adjusted = np.empty_like(p)
  adjusted[order] = np.maximum.accumulate(scaled)
  return adjusted


def tost(differences, margin: float) -> float:
  """p-value of equivalence within (-margin, margin) by two one-sided t-tests: the larger
  of the p of H0 "mean <= -margin" and of H0 "mean >= margin". p <= alpha means the mean
  difference is within the margin at level alpha (its 1 - 2 alpha interval lies inside).
  1.0 (not shown equivalent) below two values or for zero spread outside the margin."""
  d = _nonempty(differences)
  if d.size < 2:
    return 1.0
  if np.all(d == d[0]):
    return 0.0 if abs(d[0]) < margin else 1.0
  lower = scipy.stats.ttest_1samp(d, -margin, alternative="greater").pvalue
  upper = scipy.stats.ttest_1samp(d, margin, alternative="less").pvalue
  return float(max(lower, upper))


def bootstrap_ci(values, rng: np.random.Generator, draws: int) -> tuple[float, float, float]:
  """Mean and 95% percentile-bootstrap interval of the mean (report it only from MIN_SEEDS
  values: below that it is little more than their range)."""
  values = np.asarray(values, float)
  if len(values) == 1:
    return float(values[0]), float(values[0]), float(values[0])
  means = rng.choice(values, (draws, len(values))).mean(axis=1)
  return float(values.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def reported_ci(values, rng: np.random.Generator,
                draws: int) -> tuple[float, float | None, float | None]:
  """`bootstrap_ci`, or (mean, None, None) below MIN_SEEDS values: no interval is reported
  there (it would be about their range)."""
  if len(values) < MIN_SEEDS:
    return float(np.mean(values)), None, None
  return bootstrap_ci(values, rng, draws)


def ols_slope(x, y, rng: np.random.Generator) -> tuple[float, float, float]:
  """OLS slope of y on x and a 95% bootstrap interval over the (x, y) pairs (2,000
  resamples, those with a constant x left out)."""
  draws = rng.integers(0, len(x), (2000, len(x)))
  xs, ys = np.asarray(x, np.float64)[draws], np.asarray(y, np.float64)[draws]
  xs, ys = xs - xs.mean(1, keepdims=True), ys - ys.mean(1, keepdims=True)
  spread = np.sum(xs * xs, 1)
  kept = np.ptp(xs, 1) > 0
  slopes = np.sum(xs * ys, 1)[kept] / spread[kept]
  return (float(scipy.stats.linregress(x, y).slope),
          *map(float, np.quantile(slopes, [0.025, 0.975])))


def _nonempty(differences) -> np.ndarray:
  d = np.asarray(differences, np.float64).reshape(-1)
  if d.size == 0 or not np.all(np.isfinite(d)):
    raise ValueError(f"Expected a non-empty array of finite paired differences, got {d}.")
  return d
