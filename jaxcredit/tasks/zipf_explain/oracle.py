"""The Rao-Blackwellised Monte-Carlo oracle of `zipf_explain`: V^pi(s_c) at cut points.

A response of T tokens in a vocabulary of 50 admits no exact tree (E-TREE enumerates
|A|^T paths), but its reward reads the answers only. So, from the state s_c (prompt and
the first c response tokens), draw M continuations from pi in which every answer slot
(the column after the k-th MARK, k <= K) is forced to the right key c_k and weighted by
pi's probability of it:

  V-hat(s_c) = (1/M) sum_m R(y^m) prod_{answer slots t >= c of y^m} pi(c_k | y^m_<t)

Unbiased: R is 0 unless every answer is right, so summing the answer token out exactly
(Rao-Blackwellisation) leaves the words and MARKs to sample. Its variance is no larger
than plain Monte-Carlo's (which samples the answers too; `rao_blackwell=False`), and
much smaller when pi is far from the answers. Credit of the tokens between two cuts
c < c': V-hat(s_c') - V-hat(s_c).
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxcredit.models.transformer import KVCache, Transformer
from jaxcredit.tasks.zipf_explain import definition as zipf_explain


def rb_values(model: Transformer, rows, targets, cuts, key,
              config: zipf_explain.ZipfExplainConfig, *, n_paths: int,
              rao_blackwell: bool = True):
  """Value estimates and their standard errors at the states s_c, c in `cuts`. Traceable.

  The ``B C M`` continuations decode together with a KV cache: the prompt in one chunk, then
  one column per step, the row's own token before its cut, pi's (or the forced answer) from
  it.

  Args:
    model: pi (temperature 1, restricted to `zipf_explain.allowed`).
    rows: ``[B, P + T]`` prompts and responses.
    targets: ``[B, K]`` the right key indices.
    cuts: ``[C]`` or per row ``[B, C]``, ints in [0, T].
    key: a PRNG key.
    config: the task's `ZipfExplainConfig`.
    n_paths: M continuations per state.
    rao_blackwell: force the right answer at each answer slot and weight the path by
      its probability, instead of sampling the answer.

  Returns:
    ``(values, stderr)``, float32 ``[B, C]`` each.

  Raises:
    ValueError: on shapes other than those above.
  """
  rows, targets, cuts = jnp.asarray(rows), jnp.asarray(targets), jnp.asarray(cuts)
  b, width = rows.shape
  p, t = config.prompt_length, config.length
  if width != p + t or targets.shape != (b, config.n_answers) or cuts.ndim not in (1, 2) or (
      cuts.ndim == 2 and cuts.shape[0] != b):
    raise ValueError(f"Expected rows [B, {p + t}], targets [B, {config.n_answers}] and cuts "
                     f"[C] or [B, C], got {rows.shape}, {targets.shape} and {cuts.shape}.")
  n_cuts = cuts.shape[-1]
  tokens = jnp.repeat(rows, n_cuts * n_paths, axis=0)  # [B C M, P + T], b-major
  n = tokens.shape[0]
  starts = jnp.repeat(jnp.broadcast_to(cuts, (b, n_cuts)).reshape(-1), n_paths)
  right = jnp.repeat(targets, n_cuts * n_paths, axis=0) + zipf_explain.KEY0
  allowed = jnp.asarray(zipf_explain.allowed(config))
  layers = model.unstacked_layers()
  cache = KVCache.zeros(model.config, n, p + t)
  out, cache = model.decode(tokens[:, :p], jnp.broadcast_to(jnp.arange(p), (n, p)),
                            jnp.ones((n, p), bool), cache, 0, logits=False, layers=layers)
  logits = model.logits(out.hidden[:, -1])

  def column(j, carry):
    tokens, weight, logits, cache, marks = carry
    logp = jax.nn.log_softmax(jnp.where(allowed[j], logits, -jnp.inf))
    # The column after the k-th MARK (k <= K) is the k-th answer slot.
    answer = (tokens[:, p + j - 1] == zipf_explain.MARK) & (marks <= config.n_answers) & (j > 0)
    forced = jnp.take_along_axis(right, jnp.clip(marks - 1, 0, None)[:, None], 1)[:, 0]
    sampled = jax.random.categorical(jax.random.fold_in(key, j), logp)
    active = j >= starts
    summed = active & answer & rao_blackwell
    token = jnp.where(active, jnp.where(summed, forced, sampled), tokens[:, p + j])
    weight = weight * jnp.where(summed, jnp.exp(jnp.take_along_axis(
        logp, forced[:, None], 1)[:, 0]), 1.0)
    out, cache = model.decode(token[:, None], jnp.full((n, 1), p + j), jnp.ones((n, 1), bool),
                              cache, p + j, layers=layers)
    return (tokens.at[:, p + j].set(token), weight, out.logits[:, 0], cache,
            marks + (token == zipf_explain.MARK))

  init = (tokens, jnp.ones(n), logits, cache, jnp.zeros(n, jnp.int32))
  tokens, weight, *_ = jax.lax.fori_loop(0, t, column, init)
  estimates = (weight * zipf_explain.outcome(tokens[:, p:], right - zipf_explain.KEY0, config)
               ).reshape(b, n_cuts, n_paths)
  spread = jnp.std(estimates, axis=-1, ddof=1) if n_paths > 1 else jnp.zeros((b, n_cuts))
  return jnp.mean(estimates, axis=-1), spread / np.sqrt(n_paths)


def cuts_of(responses, config: zipf_explain.ZipfExplainConfig, stride: int):
  """The cut columns of responses: 0, T, every `stride`-th column, and around each of the first
  K + 1 MARKs (before it, before its answer, after the answer: the states whose values price
  the MARK and the answer; a (K + 1)-th MARK sets R = 0). Traceable.

  Args:
    responses: ``[B, T]`` token ids.
    config: the task's `ZipfExplainConfig`.
    stride: columns between regular cuts.

  Returns:
    int ``[B, C]``, sorted, ``C = 2 + ceil(T / stride) - 1 + 3 (K + 1)`` for every row (a row
    with fewer MARKs repeats T).
  """
  t, b = config.length, responses.shape[0]
  marks = jax.vmap(lambda row: jnp.nonzero(row == zipf_explain.MARK, size=config.n_answers + 1,
                                           fill_value=t)[0])(responses)
  around = jnp.minimum(marks[:, :, None] + jnp.arange(3), t).reshape(b, -1)
  grid = jnp.broadcast_to(jnp.arange(0, t, stride)[1:], (b, len(range(stride, t, stride))))
  ends = jnp.broadcast_to(jnp.asarray([0, t]), (b, 2))
  return jnp.sort(jnp.concatenate([ends, grid, around], axis=1), axis=1)


def credit_from_cuts(values, cuts, length: int):
  """Token values and credit from value estimates at the cuts. Traceable.

  The change of V-hat across the segment ``[c_i, c_(i+1))`` holding t is spread evenly over
  its tokens, and V-hat interpolated so that ``V(s_t) + credit_t = V(s_(t+1))`` (the credit
  of a row sums to ``V-hat(s_T) - V-hat(s_0) = R - V-hat(s_0)``). A segment of one token (an
  answer between its cuts) gets its exact change.

  Args:
    values: ``[B, C]`` V-hat at the cuts.
    cuts: ``[B, C]`` sorted, the first 0 and the last T.
    length: T.

  Returns:
    ``(values, credit)``, float32 ``[B, T]`` each.
  """
  columns = jnp.arange(length)

  def row(values, cuts):
    # A column cut twice has two estimates: both read the last, so the credit telescopes.
    values = values[jnp.searchsorted(cuts, cuts, side="right") - 1]
    after = jnp.searchsorted(cuts, columns, side="right")  # first cut > t
    right, left = cuts[after], cuts[after - 1]
    slope = (values[after] - values[after - 1]) / jnp.maximum(right - left, 1)
    return values[after - 1] + slope * (columns - left), slope

  return jax.vmap(row)(values, cuts)
