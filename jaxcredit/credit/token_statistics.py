"""KTAE's key-token scores (arXiv 2505.16826): token-type statistics against correctness,
per group, traceable (jit, vmap).

For each group (the G responses of one prompt) and each token type v among its actions,
the 2x2 table (a, b, c, d) counts the correct responses holding v, the incorrect ones
holding v, the correct ones without and the incorrect ones without (correct: reward > 0,
as the reference implementation has it). Then

  F     = exp(-2 p), p Fisher's exact two-sided p-value (F = 0 where p = 1)
  IG    = H(correct) - H(correct | v present)                                (bits)
  h     = asin sqrt(a / (a + c)) - asin sqrt(b / (b + d))        (Cohen's h: the direction)
  TF    = t_c / (t_w + 1e-5) - t_w / (t_c + 1e-5)                  (the term-frequency term)
  kappa = 2 (sigmoid((alpha F + beta IG) (h + TF) / (alpha + beta)) - 1/2)     in (-1, 1)

with t_c = f (k1 + 1) / (f + k1 (1 - b + b L_c / L)) the BM25 saturation of v's share f of
the tokens of the group's correct responses (L_c of them; L the mean of L_c and L_w), t_w
the same over the incorrect ones, k1 = 2, b = 0.5. Groups with only correct or only
incorrect responses get kappa = 0. Fisher's p counts the tables at most as likely as the
observed one up to a relative 1e-5 (float32 rounding of equally likely tables; scipy's
tolerance is 1e-7 in float64), over the support's total probability, so that p is exactly 1
where every table counts.
"""

import jax
import jax.numpy as jnp
from jax import Array

BM25_K1, BM25_B = 2.0, 0.5  # the reference's term-frequency saturation
TIE_TOLERANCE = 1e-5  # relative: tables as likely as the observed one, up to float32 rounding


def _log_comb(n, k):
  return jax.lax.lgamma(n + 1.0) - jax.lax.lgamma(k + 1.0) - jax.lax.lgamma(n - k + 1.0)


def fisher_p(a, b, c, d, max_total: int) -> Array:
  """Fisher's exact two-sided p-value of 2x2 tables ``[[a, b], [c, d]]``.

  The probability, under the hypergeometric law of the table's margins, of the tables at
  most as likely as the observed one.

  Args:
    a: float counts, any shape (b, c and d the same shape).
    b: float counts.
    c: float counts.
    d: float counts.
    max_total: an upper bound of ``a + b + c + d`` (the support's size).

  Returns:
    float32 p-values, the shape of `a`.

  Examples:
    >>> from jaxcredit.credit import token_statistics
    >>> round(float(token_statistics.fisher_p(3.0, 0.0, 0.0, 3.0, max_total=6)), 4)
    0.1
  """
  a, b, c, d = (jnp.asarray(x, jnp.float32) for x in (a, b, c, d))
  row, column, n = a + b, a + c, a + b + c + d
  k = jnp.arange(max_total + 1, dtype=jnp.float32)
  expand = lambda x: x[..., None]
  valid = (k >= jnp.maximum(0.0, expand(row + column - n))) & (k <= expand(jnp.minimum(row,
                                                                                    column)))
  safe = jnp.where(valid, k, expand(a))  # no lgamma of a negative count off the support
  log_p = lambda x: (_log_comb(expand(column), x) + _log_comb(expand(n - column),
                                                              expand(row) - x)
                     - _log_comb(expand(n), expand(row)))
  p_k = jnp.where(valid, jnp.exp(log_p(safe)), 0.0)
  p_observed = jnp.exp(log_p(expand(a)))
  as_likely = jnp.sum(jnp.where(p_k <= p_observed * (1 + TIE_TOLERANCE), p_k, 0.0), axis=-1)
  # Over the support's total (1 up to float32 rounding): exactly 1 when every table counts.
  return as_likely / jnp.sum(p_k, axis=-1)


def _entropy_bits(p):
  p = jnp.clip(p, 0.0, 1.0)
  term = lambda q: jnp.where(q > 0, -q * jnp.log2(jnp.where(q > 0, q, 1.0)), 0.0)
  return term(p) + term(1.0 - p)


def key_token_table(a, b, c, d, max_total: int, *, alpha: float = 1.0,
                    beta: float = 1.0, term_frequency=0.0) -> dict[str, Array]:
  """F, IG, h and kappa (module docstring) of 2x2 tables (a, b, c, d).

  Args:
    a: float counts of correct responses holding the token type, any shape.
    b: incorrect responses holding it.
    c: correct responses without it.
    d: incorrect responses without it.
    max_total: an upper bound of each table's total.
    alpha: the weight of F.
    beta: the weight of IG.
    term_frequency: the TF term, the shape of `a` (0: left out).

  Returns:
    ``{"F", "IG", "h", "kappa"}``, float32 arrays of `a`'s shape; kappa = 0 where a table has
    no correct or no incorrect response.
  """
  a, b, c, d = (jnp.asarray(x, jnp.float32) for x in (a, b, c, d))
  n = a + b + c + d
  p = fisher_p(a, b, c, d, max_total)
  fisher = jnp.where(p < 1.0, jnp.exp(-2.0 * p), 0.0)
  with_v, without_v = a + b, c + d
  conditional = (with_v * _entropy_bits(a / jnp.maximum(with_v, 1.0))
                 + without_v * _entropy_bits(c / jnp.maximum(without_v, 1.0))) / jnp.maximum(n, 1)
  gain = _entropy_bits((a + c) / jnp.maximum(n, 1.0)) - conditional
  h = (jnp.arcsin(jnp.sqrt(a / jnp.maximum(a + c, 1.0)))
       - jnp.arcsin(jnp.sqrt(b / jnp.maximum(b + d, 1.0))))
  contrast = (a + c > 0) & (b + d > 0)
  kappa = 2.0 * (jax.nn.sigmoid((alpha * fisher + beta * gain) * (h + term_frequency)
                                / (alpha + beta)) - 0.5)
  return {"F": fisher, "IG": gain, "h": h, "kappa": jnp.where(contrast, kappa, 0.0)}


def _saturated(count, length, mean_length):
  """BM25's saturation of a token type's share count / length of a document."""
  share = count / jnp.maximum(length, 1.0)
  k = BM25_K1 * (1.0 - BM25_B + BM25_B * length / jnp.maximum(mean_length, 1.0))
  return share * (BM25_K1 + 1.0) / (share + k)


def ktae_scores(tokens, mask, rewards, group_size: int, *, vocab_size: int,
                alpha: float = 1.0, beta: float = 1.0, term_frequency: bool = True) -> Array:
  """KTAE's key-token score kappa (module docstring) of each action's token type within its
  group. Traceable; memory ``O(B L G + groups x vocab_size)``.

  Args:
    tokens: ``[B, L]`` int ids < vocab_size; rows of a group contiguous.
    mask: ``[B, L]`` bool, the actions.
    rewards: ``[B]`` (correct: > 0).
    group_size: G, responses per prompt.
    vocab_size: the vocabulary size.
    alpha: the weight of Fisher's F.
    beta: the weight of the information gain.
    term_frequency: include the BM25 term-frequency term.

  Returns:
    float32 ``[B, L]`` in (-1, 1), 0 off `mask`.

  References:
    Sun et al., 2025, "KTAE: A Model-Free Algorithm to Key-Tokens Advantage Estimation in
    Mathematical Reasoning", arXiv 2505.16826.
  """
  tokens, mask = jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, bool)
  rows = tokens.shape[0]
  groups = rows // group_size
  group = (jnp.arange(rows) // group_size)[:, None]
  correct = (jnp.asarray(rewards) > 0).astype(jnp.int32)[:, None]
  # A row's first action of each type (sorted within the row) counts its presence once.
  ids = jnp.where(mask, tokens, vocab_size)  # vocab_size: no action
  ordered = jnp.sort(ids, axis=1)
  first = jnp.concatenate([jnp.ones_like(ordered[:, :1], bool),
                           ordered[:, 1:] != ordered[:, :-1]], axis=1) & (ordered < vocab_size)
  table = jnp.zeros((groups, vocab_size + 1, 2), jnp.float32)
  holding = table.at[group, ordered, correct].add(first)  # responses holding v
  counts = table.at[group, ids, correct].add(mask)  # occurrences of v
  a, b = holding[group, tokens, 1], holding[group, tokens, 0]  # [B, L]
  n_correct = jnp.sum(correct[:, 0].reshape(groups, group_size), axis=1)[group]
  n_incorrect = group_size - n_correct
  tf = 0.0
  if term_frequency:
    lengths = jnp.zeros((groups, 2)).at[group[:, 0], correct[:, 0]].add(jnp.sum(mask, 1))
    mean_length = jnp.mean(lengths, axis=1, keepdims=True)
    saturated = _saturated(counts[group, tokens], lengths[group], mean_length[group])
    t_c, t_w = saturated[..., 1], saturated[..., 0]
    tf = t_c / (t_w + 1e-5) - t_w / (t_c + 1e-5)
  kappa = key_token_table(a, b, n_correct - a, n_incorrect - b, group_size, alpha=alpha,
                          beta=beta, term_frequency=tf)["kappa"]
  return jnp.where(mask, kappa, 0.0)
