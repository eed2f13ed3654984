"""Token-type statistics against correctness, computed on the host per group:
KTAE's key-token scores (arXiv 2505.16826; xiaolizh1/KTAE compute_key_tokens.py).

For each group (the G responses of one prompt) and each token type v present
in it, the 2x2 table (a, b, c, d) counts correct responses containing v,
incorrect containing v, correct without, incorrect without. Then
  F     = exp(-2 p)  with p Fisher's exact two-sided p-value (F = 0 when p = 1)
  IG    = H(correct) - H(correct | v present)                      (bits)
  h     = asin sqrt(a / (a + c)) - asin sqrt(b / (b + d))           (Cohen's h: the direction)
  kappa = 2 (sigmoid((alpha F + beta IG) h / (alpha + beta)) - 1/2)  in (-1, 1)
Groups with only correct or only incorrect responses get kappa = 0. The
reference implementation adds a BM25-style term-frequency factor to h; it is
left out here (token presence only).
"""

import numpy as np


def _entropy(p: np.ndarray) -> np.ndarray:
  p = np.clip(p, 1e-12, 1 - 1e-12)
  return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


def key_token_table(present: np.ndarray, correct: np.ndarray) -> dict[str, float]:
  """F, IG, h and kappa (alpha = beta = 1) of one token type from [G] presence and correctness."""
  a = float(np.sum(present & correct))
  b = float(np.sum(present & ~correct))
  c = float(np.sum(~present & correct))
  d = float(np.sum(~present & ~correct))
  n = a + b + c + d
  if a + c == 0 or b + d == 0:
    return {"F": 0.0, "IG": 0.0, "h": 0.0, "kappa": 0.0}
  from scipy import stats  # noqa: PLC0415 - 0.7 s to import; every CLI start would pay it

  p = stats.fisher_exact([[a, b], [c, d]]).pvalue
  fisher = 0.0 if p >= 1.0 else float(np.exp(-2 * p))
  with_v, without_v = a + b, c + d
  conditional = sum(count / n * _entropy(np.array(hits / count))
                    for hits, count in ((a, with_v), (c, without_v)) if count > 0)
  gain = float(_entropy(np.array((a + c) / n)) - conditional)
  h = float(np.arcsin(np.sqrt(a / (a + c))) - np.arcsin(np.sqrt(b / (b + d))))
  kappa = 2 * (1 / (1 + np.exp(-(fisher + gain) * h / 2)) - 0.5)
  return {"F": fisher, "IG": gain, "h": h, "kappa": float(kappa)}


def ktae_scores(tokens: np.ndarray, mask: np.ndarray, rewards: np.ndarray,
                group_size: int) -> np.ndarray:
  """[B, T] kappa of each action's token type within its group (0 off the mask).

  tokens, mask: [B, T]; rewards: [B] (correct: reward > 0.5); rows of a group contiguous.
  """
  tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
  correct = np.asarray(rewards) > 0.5
  out = np.zeros(tokens.shape)
  for start in range(0, len(tokens), group_size):
    rows = slice(start, start + group_size)
    group_tokens, group_mask = tokens[rows], mask[rows]
    for v in np.unique(group_tokens[group_mask]):
      present = ((group_tokens == v) & group_mask).any(axis=1)
      kappa = key_token_table(present, correct[rows])["kappa"]
      out[rows] += np.where((group_tokens == v) & group_mask, kappa, 0.0)
  return out
