"""Events as outcomes: Kaplan-Meier time to a level, McNemar's exact test, Fisher's power,
against direct computations (the product-limit estimator, binomial sums, scipy's own test)."""

import math

import numpy as np
import pytest
import scipy.stats

from jaxcredit.lab import outcomes

def _kaplan_meier(times, reached):
  """The product-limit estimate from its definition: S(t) = prod over event times u <= t of
  (1 - events at u / runs still at risk at u)."""
  times, reached = np.asarray(times, np.float64), np.asarray(reached, bool)
  survival, curve = 1.0, {}
  for u in np.unique(times[reached]):
    survival *= 1.0 - np.sum(reached & (times == u)) / np.sum(times >= u)
    curve[u] = survival
  return curve


def test_time_to_level_is_the_kaplan_meier_median_with_runs_censored_at_their_budget():
  rng = np.random.default_rng(6)
  for _ in range(30):
    n = int(rng.integers(5, 30))
    times = rng.exponential(1.0, n)
    reached = rng.uniform(size=n) < rng.uniform(0.3, 1.0)
    times[~reached] = np.minimum(times[~reached] + rng.exponential(1.0, (~reached).sum()), 3.0)
    out = outcomes.time_to_level(times, reached)
    want = next((u for u, s in _kaplan_meier(times, reached).items() if s <= 0.5 + 1e-12), None)
    assert out["median"] == want and out["reached"] == pytest.approx(reached.mean())
    if want is not None and out["low"] is not None:
      assert out["low"] <= want and (out["high"] is None or want <= out["high"])
  # Two of ten runs reach the level early, eight never do: the median of those that reach
  # it (1.5) is survivor-biased; the Kaplan-Meier median and its upper bound lie beyond the
  # budget.
  out = outcomes.time_to_level([1.0, 2.0] + [10.0] * 8, [True] * 2 + [False] * 8)
  assert (out["median"], out["high"], out["reached"]) == (None, None, 0.2)
  assert outcomes.time_to_level([5.0, 6.0], [False, False])["median"] is None
  uncensored = outcomes.time_to_level([4.0, 1.0, 3.0, 2.0], [True] * 4)
  assert uncensored["median"] == 2.0  # the first time half the runs have reached it
  with pytest.raises(ValueError, match="one time and one reached flag per run"):
    outcomes.time_to_level([1.0], [True, False])


def test_paired_binary_p_is_the_exact_binomial_test_of_the_discordant_seeds():
  rng = np.random.default_rng(7)
  for _ in range(50):
    n = int(rng.integers(1, 40))
    first, second = rng.uniform(size=n) < rng.uniform(), rng.uniform(size=n) < rng.uniform()
    b, c = int(np.sum(first & ~second)), int(np.sum(second & ~first))
    want = 1.0 if b + c == 0 else min(
        1.0, 2 * sum(math.comb(b + c, k) for k in range(min(b, c) + 1)) / 2 ** (b + c))
    assert outcomes.paired_binary_p(first, second) == pytest.approx(want, rel=1e-9)
  with pytest.raises(ValueError, match="one outcome per seed"):
    outcomes.paired_binary_p([True], [True, False])


def test_fishers_power_is_the_rejection_rate_of_scipys_fisher_exact_test():
  rng = np.random.default_rng(8)
  for n, p1, p2 in ((12, 0.5, 0.1), (20, 0.3, 0.05), (8, 0.2, 0.2)):
    first, second = rng.binomial(n, p1, 3000), rng.binomial(n, p2, 3000)
    simulated = np.mean([scipy.stats.fisher_exact([[x, n - x], [y, n - y]]).pvalue <= 0.05
                         for x, y in zip(first, second)])
    want = outcomes.fisher_power(n, p1, p2)
    assert abs(simulated - want) < 4 * np.sqrt(want * (1 - want) / 3000) + 1e-3, (n, p1, p2)
  seeds = outcomes.seeds_for_power(0.2, 0.0)
  assert outcomes.fisher_power(seeds, 0.2, 0.0) >= 0.8 > outcomes.fisher_power(
      seeds - 5, 0.2, 0.0)
  assert outcomes.seeds_for_power(0.2, 0.19, most=50) is None
