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
  """Two-sided p-value of H0 "the paired differences are symmetric about 0", by a sign-flip
  permutation test of their mean.

  The fraction of sign patterns s in {-1, 1}^n with ``|mean(s d)| >= |mean(d)|``: exact (all
  2^n patterns) for n <= EXACT_FLIPS, else `draws` random patterns (the observed one
  counted).

  Args:
    differences: the per-seed paired differences, finite, non-empty.
    rng: the generator of the random patterns; None for ``default_rng(0)``.
    draws: random patterns when n > EXACT_FLIPS.

  Returns:
    the p-value; 1.0 when every difference is 0.

  Raises:
    ValueError: on an empty or non-finite array.

  Examples:
    >>> from jaxcredit.lab import statistics
    >>> statistics.sign_flip_p([1.0, 2.0, 3.0])  # 2 of the 8 patterns are as extreme
    0.25
  """
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
  """Holm's step-down adjusted p-values::

    p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))      with p_(1) <= ... <= p_(m)

  Rejecting p~ <= alpha controls the family-wise error rate at alpha.

  Args:
    p_values: m p-values.

  Returns:
    float64 ``[m]``, in the input's order.

  References:
    Holm, 1979, "A Simple Sequentially Rejective Multiple Test Procedure", Scandinavian
    Journal of Statistics 6.

  Examples:
    >>> from jaxcredit.lab import statistics
    >>> statistics.holm([0.01, 0.04, 0.03]).round(3).tolist()
    [0.03, 0.06, 0.06]
  """
  p = np.asarray(p_values, np.float64)
  order = np.argsort(p, kind="stable")
  scaled = np.minimum(1.0, (len(p) - np.arange(len(p))) * p[order])
  adjusted = np.empty_like(p)
  adjusted[order] = np.maximum.accumulate(scaled)
  return adjusted


def tost(differences, margin: float) -> float:
  """p-value of equivalence within (-margin, margin) by two one-sided t-tests.

  The larger of the p of H0 "mean <= -margin" and of H0 "mean >= margin". p <= alpha means
  the mean difference is within the margin at level alpha (its 1 - 2 alpha interval lies
  inside).

  Args:
    differences: the per-seed paired differences, finite, non-empty.
    margin: the equivalence margin, > 0.

  Returns:
    the p-value; 1.0 (not shown equivalent) below two values or for zero spread outside the
    margin, 0.0 for zero spread inside it.

  Raises:
    ValueError: on an empty or non-finite array.

  References:
    Schuirmann, 1987, "A comparison of the two one-sided tests procedure and the power
    approach for assessing the equivalence of average bioavailability", J. Pharmacokinet.
    Biopharm. 15.
  """
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
  values: below that it is little more than their range).

  Args:
    values: the per-seed values.
    rng: the resampling generator.
    draws: bootstrap resamples.

  Returns:
    ``(mean, low, high)``; all the value itself for one value.
  """
  values = np.asarray(values, float)
  if len(values) == 1:
    return float(values[0]), float(values[0]), float(values[0])
  means = rng.choice(values, (draws, len(values))).mean(axis=1)
  return float(values.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def reported_ci(values, rng: np.random.Generator,
                draws: int) -> tuple[float, float | None, float | None]:
  """`bootstrap_ci`, without an interval below MIN_SEEDS values (it would be about their
  range).

  Args:
    values: the per-seed values.
    rng: the resampling generator.
    draws: bootstrap resamples.

  Returns:
    ``(mean, low, high)``, or ``(mean, None, None)`` below MIN_SEEDS values.
  """
  if len(values) < MIN_SEEDS:
    return float(np.mean(values)), None, None
  return bootstrap_ci(values, rng, draws)


def ols_slope(x, y, rng: np.random.Generator) -> tuple[float, float, float]:
  """OLS slope of y on x and a 95% bootstrap interval over the (x, y) pairs (2,000 resamples,
  those with a constant x left out).

  Args:
    x: the regressor values.
    y: the responses, one per x.
    rng: the resampling generator.

  Returns:
    ``(slope, low, high)``.
  """
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
