"""Outcomes that are events, not values: whether a run reached a level and when, whether it
stalled, and how many seeds it takes to tell two arms' rates of an event apart.

  time_to_level(times, reached)       Kaplan-Meier median time to a level, runs censored
  paired_binary_p(first, second)      exact McNemar p of paired yes/no outcomes (stalls)
  fisher_power(seeds, p1, p2)         Fisher's exact test's power at p1 vs p2
  seeds_for_power(p1, p2)             seeds per arm for Fisher's exact test to see p1 vs p2

The values a run ends at (its AUC, its final J) are compared in `statistics`.
"""

import warnings

import numpy as np
import scipy.stats

def time_to_level(times, reached) -> dict:
  """Kaplan-Meier estimate of the time a run takes to reach a level, each run that never
  reaches it censored at its last time (the budget): no survivor bias from leaving those
  runs out.

  The survival function S(t) (`scipy.stats.ecdf` on right-censored data) is the chance a
  run has not reached the level by t; the median is the first t with S(t) <= 1/2, and its
  95% interval (Brookmeyer and Crowley) the times whose log-log pointwise band holds 1/2.

  Args:
    times: per run, the time it reached the level, or its last time if it never did.
    reached: per run, whether it reached the level.

  Returns:
    {"median", "low", "high"}: each a time, or None where S stays above 1/2 (the median
    lies beyond every run's budget); "reached": the fraction of runs that reached it.

  Raises:
    ValueError: on no runs or mismatched lengths.

  References:
    Kaplan and Meier, 1958, "Nonparametric Estimation from Incomplete Observations", JASA
    53; Brookmeyer and Crowley, 1982, "A Confidence Interval for the Median Survival Time",
    Biometrics 38.

  Examples:
    >>> from jaxcredit.lab import outcomes
    >>> outcomes.time_to_level([1.0, 2.0, 3.0, 4.0], [True, True, False, False])["median"]
    2.0
  """
  times, reached = np.asarray(times, np.float64), np.asarray(reached, bool)
  if times.size == 0 or times.shape != reached.shape:
    raise ValueError(f"Expected one time and one reached flag per run, got {times} and "
                     f"{reached}.")
  out = {"median": None, "low": None, "high": None, "reached": float(reached.mean())}
  if not reached.any():
    return out
  sf = scipy.stats.ecdf(scipy.stats.CensoredData(uncensored=times[reached],
                                                 right=times[~reached])).sf
  with warnings.catch_warnings():  # the band is undefined where S is 0 or 1: NaN there
    warnings.simplefilter("ignore", RuntimeWarning)
    band = sf.confidence_interval(0.95, method="log-log")
  first_at_half = lambda probabilities: next(  # S = 1/2 exactly, up to rounding, counts
      (float(t) for t, p in zip(sf.quantiles, probabilities) if p <= 0.5 + 1e-12), None)
  with np.errstate(invalid="ignore"):
    out.update(median=first_at_half(sf.probabilities), low=first_at_half(band.low.probabilities),
               high=first_at_half(band.high.probabilities))
  return out


def paired_binary_p(first, second) -> float:
  """Exact McNemar p-value of H0 "the two arms' yes/no outcomes are exchangeable", paired by
  seed: of the n seeds where they differ, the count where only `first` says yes is
  Binomial(n, 1/2) under H0 (two-sided: twice the smaller tail, at most 1).

  Args:
    first: per seed, one arm's outcome (bool), e.g. "the run stalled".
    second: per seed, the other arm's.

  Returns:
    the p-value; 1.0 when the arms agree on every seed.

  Raises:
    ValueError: on outcomes of different lengths.

  References:
    McNemar, 1947, "Note on the sampling error of the difference between correlated
    proportions or percentages", Psychometrika 12.

  Examples:
    >>> from jaxcredit.lab import outcomes
    >>> outcomes.paired_binary_p([1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0])  # 2 x 2^-5
    0.0625
  """
  first, second = np.asarray(first, bool), np.asarray(second, bool)
  if first.shape != second.shape:
    raise ValueError(f"Expected one outcome per seed for both arms, got {first.shape} and "
                     f"{second.shape}.")
  only_first, only_second = int(np.sum(first & ~second)), int(np.sum(second & ~first))
  if only_first + only_second == 0:
    return 1.0
  tail = scipy.stats.binom.cdf(min(only_first, only_second), only_first + only_second, 0.5)
  return float(min(1.0, 2 * tail))


def fisher_power(seeds: int, p1: float, p2: float, alpha: float = 0.05) -> float:
  """The chance that Fisher's exact test (two-sided, at alpha) tells two arms apart whose
  runs each say yes (e.g. stall) with chances p1 and p2: the sum of the two binomials'
  probabilities over the tables it rejects (exact enumeration).

  Args:
    seeds: runs per arm.
    p1: one arm's chance of a yes.
    p2: the other's.
    alpha: the test's level.

  Returns:
    the power, in [0, 1].
  """
  n = seeds
  counts = np.arange(n + 1)
  chance = scipy.stats.binom.pmf(counts, n, p1)[:, None] * scipy.stats.binom.pmf(counts, n, p2)
  rejected = np.zeros((n + 1, n + 1), bool)
  for total in range(2 * n + 1):  # given the total yes count, the first arm's is hypergeometric
    first = np.arange(max(0, total - n), min(n, total) + 1)
    pmf = scipy.stats.hypergeom.pmf(first, 2 * n, total, n)
    ordered = np.sort(pmf)
    p = np.cumsum(ordered)[np.searchsorted(ordered, pmf * (1 + 1e-7), side="right") - 1]
    rejected[first, total - first] = p <= alpha
  return float(chance[rejected].sum())


def seeds_for_power(p1: float, p2: float, *, alpha: float = 0.05, power: float = 0.8,
                    step: int = 5, most: int = 200) -> int | None:
  """The fewest seeds per arm (a multiple of `step`) at which Fisher's exact test tells
  chances p1 and p2 apart with probability `power` (`fisher_power`).

  Args:
    p1: one arm's chance of a yes.
    p2: the other's.
    alpha: the test's level.
    power: the chance of telling them apart asked for.
    step: seeds are counted in steps of this many.
    most: the most seeds tried.

  Returns:
    the seeds per arm, or None beyond `most`.

  Examples:
    >>> from jaxcredit.lab import outcomes
    >>> outcomes.seeds_for_power(0.2, 0.0)  # 20% of stalls against none
    40
  """
  return next((n for n in range(step, most + 1, step)
               if fisher_power(n, p1, p2, alpha) >= power), None)
