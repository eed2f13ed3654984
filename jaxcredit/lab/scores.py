"""How well an estimator's [B, T] credit matches oracle credit.

All statistics are computed on the host in float64 over the scored tokens
W = mask & evaluated. Rows with no scored token are dropped. Each returns a
`Stat(value, defined, n)`: a statistic without enough data (zero variance,
fewer than 3 points) is reported as undefined with value 0.0, never NaN. ::

  correlations(est, oracle, w)   pooled Pearson
                                 r_pool = (C_b + C_w) / sqrt((S_b + S_w)(S^_b + S^_w)),
                                 its between-row / within-row parts, eta^2 = S_b / (S_b + S_w)
                                 (sqrt(eta^2) bounds r_pool of any sequence-level estimator),
                                 R^2_w = C_w^2 / (S_w S^_w) (0 for constant rows), per-row r
                                 (Fisher-z mean)
  spearman(est, oracle, w)       pooled, on average ranks
  sign_agreement(...)            SA and mass-weighted SA_w on |A| > max(0.01, 2 SE)
  decisive_mass(x, w, decisive)  mean over rows of sum_{t in D} |x| / sum_t |x|
  top_k_overlap(est, oracle, w, k)  expected overlap of the top-k |credit| sets (ties shared)
  scale_nmse(est, oracle, w)     1 - max(0, cos)^2: error left after the best non-negative rescaling
"""

from typing import NamedTuple

import numpy as np
from scipy import stats as scipy_stats


class Stat(NamedTuple):
  """One score of an estimator against the oracle.

  Attributes:
    value: the statistic (0.0 when undefined).
    defined: whether it is defined (enough tokens, some spread).
    n: the tokens or rows it is computed over.
  """
  value: float
  defined: bool
  n: int


def _undefined(n: int) -> Stat:
  return Stat(0.0, False, int(n))


def _ratio(numerator: float, denominator: float, n: int) -> Stat:
  if n < 3 or denominator <= 1e-24:
    return _undefined(n)
  return Stat(float(numerator / denominator), True, int(n))


def _rows(est, oracle, weights):
  est, oracle = np.asarray(est, np.float64), np.asarray(oracle, np.float64)
  weights = np.asarray(weights, bool)
  keep = weights.any(axis=1)
  return est[keep], oracle[keep], weights[keep]


def correlations(est, oracle, weights) -> dict[str, Stat]:
  """How well an estimator's credit correlates with the exact credit, pooled, between and
  within responses (see the module docstring).

  Args:
    est: ``[B, T]`` an estimator's credit.
    oracle: ``[B, T]`` the exact credit A.
    weights: ``[B, T]`` bool, the scored tokens.

  Returns:
    `Stat` for r_pool, r_between, r_within, eta2, ceiling (sqrt eta2), r2_within and r_row;
    undefined (``defined=False``) where too few tokens or no spread.
  """
  est, oracle, w = _rows(est, oracle, weights)
  n = int(w.sum())
  if n == 0:
    return {
        k: _undefined(0)
        for k in ("r_pool", "r_between", "r_within", "eta2", "ceiling", "r2_within", "r_row")
    }
  lengths = w.sum(axis=1)
  row_mean = lambda x: (x * w).sum(axis=1) / lengths
  m, m_hat = row_mean(oracle), row_mean(est)
  mu, mu_hat = (lengths * m).sum() / n, (lengths * m_hat).sum() / n
  c_b = (lengths * (m - mu) * (m_hat - mu_hat)).sum()
  s_b, s_b_hat = (lengths * (m - mu) ** 2).sum(), (lengths * (m_hat - mu_hat) ** 2).sum()
  within, within_hat = (oracle - m[:, None]) * w, (est - m_hat[:, None]) * w
  c_w, s_w, s_w_hat = (within * within_hat).sum(), (within**2).sum(), (within_hat**2).sum()
  total = s_b + s_w
  eta2 = _ratio(s_b, total, n)
  r2_within = (Stat(0.0, True, n) if s_w_hat <= 1e-24 and s_w > 1e-24
               else _ratio(c_w**2, s_w * s_w_hat, n))
  return {
      "r_pool": _ratio(c_b + c_w, np.sqrt(total * (s_b_hat + s_w_hat)), n),
      "r_between": _ratio(c_b, np.sqrt(s_b * s_b_hat), len(lengths)),
      "r_within": _ratio(c_w, np.sqrt(s_w * s_w_hat), n),
      "eta2": eta2,
      "ceiling": Stat(float(np.sqrt(eta2.value)), eta2.defined, n),
      "r2_within": r2_within,
      "r_row": _row_correlation(est, oracle, w),
  }


def _row_correlation(est, oracle, w) -> Stat:
  """Per-response Pearson r averaged via Fisher z (weights L_i - 3); n = rows where defined."""
  zs, weights = [], []
  for e, o, valid in zip(est, oracle, w):
    e, o = e[valid], o[valid]
    if len(e) < 4 or e.std() < 1e-12 or o.std() < 1e-12:
      continue
    r = np.clip(np.corrcoef(e, o)[0, 1], -0.999999, 0.999999)
    zs.append(np.arctanh(r))
    weights.append(len(e) - 3)
  if not zs:
    return _undefined(0)
  return Stat(float(np.tanh(np.average(zs, weights=weights))), True, len(zs))


def spearman(est, oracle, weights) -> Stat:
  """Pooled Spearman correlation: Pearson on average ranks (ties share their mean rank).

  Args:
    est: ``[B, T]`` an estimator's credit.
    oracle: ``[B, T]`` the exact credit A.
    weights: ``[B, T]`` bool, the scored tokens.

  Returns:
    a `Stat`; undefined below 3 scored tokens or without spread.
  """
  est, oracle, w = _rows(est, oracle, weights)
  e, o = est[w], oracle[w]
  if len(e) < 3:
    return _undefined(len(e))
  re, ro = scipy_stats.rankdata(e), scipy_stats.rankdata(o)
  re, ro = re - re.mean(), ro - ro.mean()
  return _ratio((re * ro).sum(), np.sqrt((re**2).sum() * (ro**2).sum()), len(e))


def sign_agreement(est, oracle, weights, stderr=None, *, floor: float = 0.01) -> dict[str, Stat]:
  """How often the estimator's credit has the exact credit's sign::

    SA = |{sign est = sign A != 0}| / |S|,    S = {scored, |A| > max(floor, 2 SE)}

  and SA_w, weighted by |A|; chance is 0.5.

  Args:
    est: ``[B, T]`` an estimator's credit.
    oracle: ``[B, T]`` the exact credit A.
    weights: ``[B, T]`` bool, the scored tokens.
    stderr: ``[B, T]`` the oracle's standard error (0 for exact oracles), or None.
    floor: the smallest |A| scored.

  Returns:
    ``{"sa", "sa_weighted"}`` `Stat`; undefined when S is empty.
  """
  est, oracle, w = (np.asarray(x) for x in (est, oracle, weights))
  se = np.zeros(oracle.shape) if stderr is None else np.asarray(stderr, np.float64)
  scope = w.astype(bool) & (np.abs(oracle) > np.maximum(floor, 2 * se))
  n = int(scope.sum())
  if n == 0:
    return {"sa": _undefined(0), "sa_weighted": _undefined(0)}
  agree = (np.sign(est) == np.sign(oracle))[scope]
  mass = np.abs(oracle[scope]).astype(np.float64)
  return {"sa": Stat(float(agree.mean()), True, n),
          "sa_weighted": Stat(float((mass * agree).sum() / mass.sum()), True, n)}


def decisive_mass(x, weights, decisive) -> Stat:
  """The share of credit on the decisive tokens::

    mean over rows of sum_{t in D} w |x_t| / sum_t w |x_t|

  rows with no credit skipped.

  Args:
    x: ``[B, T]`` credit.
    weights: ``[B, T]`` bool, the scored tokens.
    decisive: ``[B, T]`` bool, the decisive tokens D.

  Returns:
    a `Stat`; undefined when no row has credit.
  """
  x = np.abs(np.asarray(x, np.float64))
  w, decisive = np.asarray(weights, bool), np.asarray(decisive, bool)
  totals = (x * w).sum(axis=1)
  keep = totals > 1e-12
  if not keep.any():
    return _undefined(0)
  shares = (x * w * decisive).sum(axis=1)[keep] / totals[keep]
  return Stat(float(shares.mean()), True, int(keep.sum()))


def _top_k_membership(x: np.ndarray, k: int) -> np.ndarray:
  """1 for the k largest; the e entries tied at the threshold share the k - g remaining places."""
  if k >= len(x):
    return np.ones(len(x))
  threshold = np.sort(x)[::-1][k - 1]
  above = x > threshold
  tied = x == threshold
  return np.where(above, 1.0, np.where(tied, (k - above.sum()) / tied.sum(), 0.0))


def top_k_overlap(est, oracle, weights, k: int | None = None) -> Stat:
  """How far the estimator's top-k tokens by |credit| are the oracle's::

    mean over rows of (1/k) sum_t m_t m*_t

  for the top-k |credit| sets (entries tied at the threshold share the remaining places).
  Chance is k / L, and a constant-credit row scores exactly that.

  Args:
    est: ``[B, T]`` an estimator's credit.
    oracle: ``[B, T]`` the exact credit A.
    weights: ``[B, T]`` bool, the scored tokens.
    k: tokens per row; None for ``ceil(0.2 L_i)``.

  Returns:
    a `Stat`; undefined without scored rows.
  """
  est, oracle, w = _rows(est, oracle, weights)
  overlaps = []
  for e, o, valid in zip(est, oracle, w):
    e, o = np.abs(e[valid]), np.abs(o[valid])
    size = k or int(np.ceil(0.2 * len(e)))
    size = min(size, len(e))
    overlaps.append((_top_k_membership(e, size) * _top_k_membership(o, size)).sum() / size)
  if not overlaps:
    return _undefined(0)
  return Stat(float(np.mean(overlaps)), True, len(overlaps))


def scale_nmse(est, oracle, weights) -> Stat:
  """The normalised squared error after the best non-negative scale::

    min_{a >= 0} sum w (A - a est)^2 / sum w A^2 = 1 - max(0, cos)^2

  Args:
    est: ``[B, T]`` an estimator's credit.
    oracle: ``[B, T]`` the exact credit A.
    weights: ``[B, T]`` bool, the scored tokens.

  Returns:
    a `Stat` in [0, 1]; undefined when the oracle is 0 everywhere.
  """
  est, oracle, w = _rows(est, oracle, weights)
  e, o = est[w], oracle[w]
  norm = np.sqrt((e**2).sum() * (o**2).sum())
  if len(e) == 0 or (o**2).sum() <= 1e-24:
    return _undefined(len(e))
  cosine = (e * o).sum() / norm if norm > 0 else 0.0
  return Stat(float(1 - max(0.0, cosine) ** 2), True, len(e))


def score(est, oracle, weights, *, stderr=None, decisive=None) -> dict[str, Stat]:
  """Every statistic of this module for one estimator.

  Args:
    est: ``[B, T]`` an estimator's credit.
    oracle: ``[B, T]`` the exact credit A.
    weights: ``[B, T]`` bool, the scored tokens.
    stderr: ``[B, T]`` the oracle's standard error, or None.
    decisive: ``[B, T]`` bool, the decisive tokens, or None.

  Returns:
    ``{name: Stat}``: `correlations`, spearman, `sign_agreement`, top_k, nmse_scale, and
    with `decisive` the decisive mass of the estimator (dm) and of the oracle (dm_oracle).
  """
  out = {
      **correlations(est, oracle, weights), "spearman": spearman(est, oracle, weights),
      **sign_agreement(est, oracle, weights, stderr), "top_k": top_k_overlap(est, oracle, weights),
      "nmse_scale": scale_nmse(est, oracle, weights)
  }
  if decisive is not None:
    out["dm"] = decisive_mass(est, weights, decisive)
    out["dm_oracle"] = decisive_mass(oracle, weights, decisive)
  return out


def resampling_noise(samples, oracle, weights) -> dict[str, Stat]:
  """Stability of credit across resampled batches.

  With X the mean over resamples and ``a* = argmin sum w (A - a X)^2``::

    rcn        = sum w Var_r(a* X^(r)) / sum w (A - mean A)^2   (relative credit noise)
    bias_ratio = sum w (a* X - A)^2 / sum w (A - mean A)^2

  Args:
    samples: ``[R, J, T]`` an estimator's credit on J fixed probe responses, each time with
      a fresh group around it (and fresh Monte-Carlo keys).
    oracle: ``[J, T]`` the exact credit A.
    weights: ``[J, T]`` bool, the scored tokens.

  Returns:
    ``{"rcn", "bias_ratio"}`` `Stat`.
  """
  samples, oracle = np.asarray(samples, np.float64), np.asarray(oracle, np.float64)
  w = np.asarray(weights, bool)
  n = int(w.sum())
  spread = ((oracle - oracle[w].mean()) ** 2 * w).sum() if n else 0.0
  mean = samples.mean(axis=0)
  power = (mean**2 * w).sum()
  if n < 3 or spread <= 1e-24:
    return {"rcn": _undefined(n), "bias_ratio": _undefined(n)}
  scale = (oracle * mean * w).sum() / power if power > 1e-24 else 0.0
  noise = ((scale * samples).var(axis=0) * w).sum()
  return {"rcn": Stat(float(noise / spread), True, n),
          "bias_ratio": Stat(float(((scale * mean - oracle) ** 2 * w).sum() / spread), True, n)}
