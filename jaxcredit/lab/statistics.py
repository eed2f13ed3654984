"""Paired comparisons over seeds, as the lab's studies report them.

  sign_flip_p(differences)            exact p of "mean difference = 0" (two- or one-sided)
  holm(p_values)                      Holm step-down adjusted p-values (family-wise error)
  tost(differences, margin)           equivalence within +-margin by two sign-flip tests
  bootstrap_ci(values, rng, draws)    mean and 95% bootstrap interval (percentile or BCa)
  reported_ci(values, rng, draws)     the same, or no interval below MIN_SEEDS values
  ols_slope(x, y, rng)                OLS slope with a 95% bootstrap interval over the pairs
  slope_p(x, y, rng)                  permutation p of "the slope is 0"
  unpaired_p(first, second)           permutation p of "two unpaired samples are exchangeable"
  welch_ci(first, second)             Welch's 95% t interval of a difference of two means
  verdict(delta, p, p_tost, margin)   higher / lower / negligible / ceiling / inconclusive

Every difference within a study is paired by seed (the same initialisation, prompts and
sampling keys), so those tests are one-sample tests of the per-seed differences; runs that
share no seeds (two trainers' runs of one cell) are compared by `unpaired_p` and `welch_ci`.
"""

import itertools
import math

import numpy as np
import scipy.stats

MIN_SEEDS = 5  # fewer seeds: a bootstrap interval is little more than their range
EXACT_FLIPS = 16  # up to 2^16 sign patterns enumerated; more are sampled
ALTERNATIVES = ("two-sided", "greater", "less")
CI_METHODS = ("percentile", "BCa")
VERDICTS = ("higher", "lower", "negligible", "ceiling", "inconclusive")


def sign_flip_p(differences, rng: np.random.Generator | None = None, draws: int = 65536,
                alternative: str = "two-sided") -> float:
  """p-value of H0 "the paired differences are symmetric about 0", by a sign-flip
  permutation test of their mean.

  The fraction of sign patterns s in {-1, 1}^n whose mean is at least as extreme as the
  observed one: ``|mean(s d)| >= |mean(d)|`` (two-sided), ``mean(s d) >= mean(d)``
  ("greater": the alternative is a positive mean) or ``mean(s d) <= mean(d)`` ("less").
  Exact (all 2^n patterns) for n <= EXACT_FLIPS, else `draws` random patterns (the
  observed one counted).

  Args:
    differences: the per-seed paired differences, finite, non-empty.
    rng: the generator of the random patterns; None for ``default_rng(0)``.
    draws: random patterns when n > EXACT_FLIPS.
    alternative: "two-sided", "greater" or "less".

  Returns:
    the p-value; 1.0 when every difference is 0.

  Raises:
    ValueError: on an empty or non-finite array, or an unknown alternative.

  Examples:
    >>> from jaxcredit.lab import statistics
    >>> statistics.sign_flip_p([1.0, 2.0, 3.0])  # 2 of the 8 patterns are as extreme
    0.25
    >>> statistics.sign_flip_p([1.0, 2.0, 3.0], alternative="greater")
    0.125
  """
  d = _nonempty(differences)
  if alternative not in ALTERNATIVES:
    raise ValueError(f"Unknown alternative {alternative!r}: expected one of {ALTERNATIVES}.")
  if not np.any(d):
    return 1.0
  sign = -1.0 if alternative == "less" else 1.0
  statistic = np.abs if alternative == "two-sided" else (lambda means: sign * means)
  observed = statistic(d.mean())
  observed -= abs(observed) * 1e-12  # ties count as at least as extreme
  if d.size <= EXACT_FLIPS:
    signs = np.asarray(list(itertools.product((-1.0, 1.0), repeat=d.size)))
    return float(np.mean(statistic(signs @ d / d.size) >= observed))
  rng = rng or np.random.default_rng(0)
  signs = rng.choice((-1.0, 1.0), (draws, d.size))
  return float((1 + np.sum(statistic(signs @ d / d.size) >= observed)) / (draws + 1))


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


def tost(differences, margin: float, rng: np.random.Generator | None = None) -> float:
  """p-value of equivalence within (-margin, margin) by two one-sided sign-flip tests.

  The larger of the p of H0 "mean <= -margin" (`sign_flip_p` of ``d + margin``,
  alternative "greater") and of H0 "mean >= margin" (of ``d - margin``, "less"): each a
  permutation test at its boundary, so no normality is assumed. p <= alpha means the mean
  difference is within the margin at level alpha. With n paired values the smallest p is
  2^-n.

  Args:
    differences: the per-seed paired differences, finite, non-empty.
    margin: the equivalence margin, > 0.
    rng: the generator of the random sign patterns above EXACT_FLIPS values.

  Returns:
    the p-value.

  Raises:
    ValueError: on an empty or non-finite array, or a margin <= 0.

  References:
    Schuirmann, 1987, "A comparison of the two one-sided tests procedure and the power
    approach for assessing the equivalence of average bioavailability", J. Pharmacokinet.
    Biopharm. 15.

  Examples:
    >>> from jaxcredit.lab import statistics
    >>> statistics.tost([0.01, -0.02, 0.0, 0.01, 0.02, -0.01], 0.05)  # 1 of 64 patterns
    0.015625
  """
  d = _nonempty(differences)
  if not margin > 0:
    raise ValueError(f"Expected an equivalence margin > 0, got {margin}.")
  above = sign_flip_p(d + margin, rng, alternative="greater")
  below = sign_flip_p(d - margin, rng, alternative="less")
  return max(above, below)


def bootstrap_ci(values, rng: np.random.Generator, draws: int,
                 method: str = "percentile") -> tuple[float, float, float]:
  """Mean and 95% bootstrap interval of the mean (report it only from MIN_SEEDS values:
  below that it is little more than their range).

  "percentile" takes the 2.5% and 97.5% quantiles of the resampled means; "BCa"
  (`scipy.stats.bootstrap`) corrects them for the bootstrap distribution's bias and
  skew, which the percentile interval under-covers at ten or so values.

  Args:
    values: the per-seed values.
    rng: the resampling generator.
    draws: bootstrap resamples.
    method: "percentile" or "BCa".

  Returns:
    ``(mean, low, high)``; all the mean for one value or values all equal.

  Raises:
    ValueError: on an unknown method.

  References:
    Efron, 1987, "Better Bootstrap Confidence Intervals", JASA 82.
  """
  if method not in CI_METHODS:
    raise ValueError(f"Unknown interval method {method!r}: expected one of {CI_METHODS}.")
  values = np.asarray(values, float)
  mean = float(values.mean())
  if len(values) == 1 or (method == "BCa" and np.ptp(values) == 0):
    return mean, mean, mean
  if method == "BCa":
    interval = scipy.stats.bootstrap((values,), np.mean, n_resamples=draws, method="BCa",
                                     rng=rng).confidence_interval
    return mean, float(interval.low), float(interval.high)
  means = rng.choice(values, (draws, len(values))).mean(axis=1)
  return mean, float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def reported_ci(values, rng: np.random.Generator, draws: int,
                method: str = "percentile") -> tuple[float, float | None, float | None]:
  """`bootstrap_ci`, without an interval below MIN_SEEDS values (it would be about their
  range).

  Args:
    values: the per-seed values.
    rng: the resampling generator.
    draws: bootstrap resamples.
    method: "percentile" or "BCa".

  Returns:
    ``(mean, low, high)``, or ``(mean, None, None)`` below MIN_SEEDS values.
  """
  if len(values) < MIN_SEEDS:
    return float(np.mean(values)), None, None
  return bootstrap_ci(values, rng, draws, method)


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


def slope_p(x, y, rng: np.random.Generator, draws: int = 9999) -> float:
  """Two-sided permutation p-value of H0 "y does not depend on x" for the OLS slope of y
  on x: the fraction of random re-pairings of y with x (the observed one counted) whose
  slope is at least as far from 0.

  Args:
    x: the regressor values, not all equal.
    y: the responses, one per x.
    rng: the permutation generator.
    draws: random re-pairings.

  Returns:
    the p-value.

  Raises:
    ValueError: on mismatched lengths or a constant x.
  """
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.shape != y.shape or np.ptp(x) == 0:
    raise ValueError(f"Expected x and y of one length with x not constant, got {x} and {y}.")
  slope = lambda y_: np.sum((x - x.mean()) * (y_ - y_.mean()), axis=-1) / np.sum(
      (x - x.mean())**2)
  observed = abs(slope(y)) * (1 - 1e-12)
  shuffled = rng.permuted(np.broadcast_to(y, (draws, len(y))), axis=1)
  return float((1 + np.sum(np.abs(slope(shuffled)) >= observed)) / (draws + 1))


def unpaired_p(first, second, rng: np.random.Generator | None = None,
               draws: int = 65536) -> float:
  """Two-sided p-value of H0 "the two samples are exchangeable", by a permutation test of
  the difference of their means: the fraction of the splits of the pooled values into groups
  of the two sizes whose difference is at least as far from 0 as the observed one. Exact (all
  splits) up to 2^EXACT_FLIPS splits, else `draws` random splits.

  Args:
    first: ``[n1]`` values of one sample (n1 >= 1).
    second: ``[n2]`` values of the other (n2 >= 1).
    rng: the generator of the sampled splits (used only past the exact limit).
    draws: sampled splits past the exact limit (the observed split counts as one more).

  Returns:
    the p-value, in (0, 1].

  Raises:
    ValueError: on an empty sample or a value that is not finite.

  References:
    Pitman, 1937, "Significance tests which may be applied to samples from any
    populations", JRSS Suppl. 4.

  Examples:
    >>> from jaxcredit.lab import statistics
    >>> statistics.unpaired_p([1.0, 2.0], [3.0, 4.0])  # 2 of the 6 splits as extreme
    0.3333333333333333
  """
  first, second = _nonempty(first), _nonempty(second)
  pooled, n = np.concatenate([first, second]), len(first)
  observed = abs(first.mean() - second.mean()) * (1 - 1e-12)  # ties count as extreme
  extreme = lambda inside: np.abs(inside @ pooled / n - ~inside @ pooled / len(second)) >= observed
  if math.comb(len(pooled), n) <= 2**EXACT_FLIPS:
    chosen = np.array(list(itertools.combinations(range(len(pooled)), n)))
    inside = np.zeros((len(chosen), len(pooled)), bool)
    np.put_along_axis(inside, chosen, True, axis=1)
    return float(np.mean(extreme(inside)))
  rng = rng or np.random.default_rng(0)
  inside = rng.permuted(np.tile(np.arange(len(pooled)) < n, (draws, 1)), axis=1)
  return float((1 + np.sum(extreme(inside))) / (draws + 1))


def welch_ci(first, second) -> tuple[float, float, float]:
  """The difference of two unpaired means and Welch's 95% t interval of it:
  ``d +- t_{0.975, nu} sqrt(s1^2 / n1 + s2^2 / n2)``, nu from Welch-Satterthwaite.

  Args:
    first: ``[n1]`` values of one sample (n1 >= 2).
    second: ``[n2]`` values of the other (n2 >= 2).

  Returns:
    ``(mean(first) - mean(second), low, high)``; the interval is the difference itself when
    both samples are constant.

  Raises:
    ValueError: on a sample of fewer than 2 values or a value that is not finite.

  References:
    Welch, 1947, "The generalization of 'Student's' problem when several different
    population variances are involved", Biometrika 34.

  Examples:
    >>> from jaxcredit.lab import statistics
    >>> [round(v, 3) for v in statistics.welch_ci([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])]
    [1.0, -1.267, 3.267]
  """
  first, second = _nonempty(first), _nonempty(second)
  if min(len(first), len(second)) < 2:
    raise ValueError(f"Welch's interval needs at least 2 values per sample, got {len(first)} "
                     f"and {len(second)}.")
  difference = float(first.mean() - second.mean())
  if np.ptp(first) == 0 and np.ptp(second) == 0:
    return difference, difference, difference
  interval = scipy.stats.ttest_ind(first, second, equal_var=False).confidence_interval(0.95)
  return difference, float(interval.low), float(interval.high)


def verdict(delta, p: float, p_equivalence: float, margin: float, *, alpha: float = 0.05,
            at_ceiling: bool = False) -> str:
  """One paired difference in words, once its p-values are corrected for multiplicity.

  In order: "n/a" without an interval (below MIN_SEEDS values); "ceiling" when both arms
  are at the metric's ceiling (a difference there says nothing about the arms);
  "higher" / "lower" when p <= alpha and the mean difference reaches the margin;
  "negligible" when it is shown inside the margin, by equivalence (p_equivalence <= alpha)
  or by a significant difference smaller than the margin; else "inconclusive" (the
  interval allows a difference beyond the margin).

  Args:
    delta: ``(mean, low, high)`` of the paired difference (`reported_ci`).
    p: the corrected p-value of "no difference".
    p_equivalence: the corrected p-value of "a difference of at least the margin" (`tost`).
    margin: the smallest difference that matters, > 0.
    alpha: the level.
    at_ceiling: whether both arms are at the ceiling.

  Returns:
    one of "n/a", VERDICTS.

  Examples:
    >>> from jaxcredit.lab import statistics
    >>> statistics.verdict((-0.001, -0.002, -0.001), p=0.004, p_equivalence=0.001, margin=0.05)
    'negligible'
    >>> statistics.verdict((0.19, -0.02, 0.41), p=0.2, p_equivalence=0.8, margin=0.05)
    'inconclusive'
  """
  mean, low, _ = delta
  if low is None:
    return "n/a"
  if at_ceiling:
    return "ceiling"
  if p <= alpha and abs(mean) >= margin:
    return "higher" if mean > 0 else "lower"
  if p_equivalence <= alpha or p <= alpha:
    return "negligible"
  return "inconclusive"


def _nonempty(differences) -> np.ndarray:
  d = np.asarray(differences, np.float64).reshape(-1)
  if d.size == 0 or not np.all(np.isfinite(d)):
    raise ValueError(f"Expected a non-empty array of finite paired differences, got {d}.")
  return d
