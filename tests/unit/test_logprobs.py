"""token_logprobs, token_entropy and chunked_token_logprobs against float64 references."""

import chex
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxcredit import logprobs
from tests import reference


def _logits(shape, seed=0, scale=3.0):
  return (scale * np.random.default_rng(seed).normal(size=shape)).astype(np.float32)


def _head_case(rng, b, t, d, v, allowed_rank):
  """Random hidden [B, T, D], unembed [D, V], allowed (None, [V], [T, V] or [B, T, V]; `full`
  is it as [B, T, V]), tokens drawn from the allowed ones, and two [B, T] weights."""
  hidden = rng.normal(size=(b, t, d)).astype(np.float32)
  unembed = rng.normal(size=(d, v)).astype(np.float32)
  allowed = {0: None, 1: rng.random(v) < 0.5, 2: rng.random((t, v)) < 0.5,
             3: rng.random((b, t, v)) < 0.5}[allowed_rank]
  full = np.ones((b, t, v), bool) if allowed is None else np.broadcast_to(allowed, (b, t, v)).copy()
  full[..., 0] = True  # every position allows at least one token
  allowed = None if allowed is None else {1: full[0, 0], 2: full[0], 3: full}[allowed_rank]
  tokens = np.stack([[rng.choice(np.flatnonzero(full[i, j])) for j in range(t)] for i in range(b)])
  return hidden, unembed, allowed, full, tokens, rng.normal(size=(2, b, t)).astype(np.float32)


class TokenLogprobsTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(shape=[(1, 1, 2), (3, 5, 7), (2, 9, 50)], temperature=[1.0, 0.7])
  def test_matches_reference(self, shape, temperature):
    logits = _logits(shape)
    tokens = np.random.default_rng(1).integers(0, shape[-1], shape[:-1])
    got = self.variant(lambda l, t: logprobs.token_logprobs(l, t, temperature=temperature))(
        logits, tokens
    )
    np.testing.assert_allclose(
      got, reference.token_logprobs(logits, tokens, temperature), atol=1e-5
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_bf16_logits_accumulate_in_float32(self):
    logits = _logits((2, 4, 300))
    tokens = np.random.default_rng(1).integers(0, 300, (2, 4))
    got = self.variant(logprobs.token_logprobs)(jnp.asarray(logits, jnp.bfloat16), tokens)
    self.assertEqual(got.dtype, jnp.float32)
    want = reference.token_logprobs(
      np.asarray(jnp.asarray(logits, jnp.bfloat16), np.float64), tokens
    )
    np.testing.assert_allclose(got, want, atol=1e-4)

  def test_shape_mismatch_raises(self):
    with pytest.raises(ValueError, match=r"logits\[2, 3, 5\].*tokens\[2, 4\]"):
      logprobs.token_logprobs(jnp.zeros((2, 3, 5)), jnp.zeros((2, 4), int))


class TokenEntropyTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters((1, 1, 2), (3, 5, 7), (2, 9, 50))
  def test_matches_reference(self, *shape):
    logits = _logits(shape)
    got = self.variant(logprobs.token_entropy)(logits)
    np.testing.assert_allclose(got, reference.token_entropy(logits), atol=1e-5)

  def test_banned_tokens_and_gradient_are_finite(self):
    logits = _logits((2, 3, 6))
    logits[..., :2] = -np.inf
    got = logprobs.token_entropy(logits)
    np.testing.assert_allclose(got, reference.token_entropy(logits[..., 2:]), atol=1e-5)
    grad = jax.grad(lambda l: jnp.sum(logprobs.token_entropy(l)))(jnp.asarray(logits))
    self.assertTrue(np.all(np.isfinite(grad)))

  def test_uniform_is_log_vocab(self):
    np.testing.assert_allclose(logprobs.token_entropy(jnp.zeros((2, 16))), np.log(16), rtol=1e-6)


def _dense_logp(hidden, unembed, tokens):
  return logprobs.token_logprobs(jnp.einsum("btd,dv->btv", hidden, unembed), tokens)


def _intermediate_sizes(jaxpr):
  """Element counts of every intermediate in a closed jaxpr, sub-jaxprs included."""
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      yield int(np.prod(var.aval.shape)) if hasattr(var.aval, "shape") else 0
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from _intermediate_sizes(sub)


class ChunkedLogprobsTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(bt=[(1, 1), (2, 7), (3, 16)], chunk_size=[1, 3, 8, 32])
  def test_value_and_grads_match_dense(self, bt, chunk_size):
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(*bt, 8)).astype(np.float32)
    unembed = rng.normal(size=(8, 40)).astype(np.float32)
    tokens = rng.integers(0, 40, bt)
    weights = rng.normal(size=bt).astype(np.float32)

    def objective(fn):
      return lambda h, w: jnp.sum(weights * fn(h, w))

    chunked = lambda h, w: logprobs.chunked_token_logprobs(h, w, tokens, chunk_size=chunk_size)
    got = self.variant(jax.value_and_grad(objective(chunked), argnums=(0, 1)))(hidden, unembed)
    dense = lambda h, w: _dense_logp(h, w, tokens)
    want = jax.value_and_grad(objective(dense), argnums=(0, 1))(hidden, unembed)
    chex.assert_trees_all_close(got, want, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(
      chunked(hidden, unembed),
      reference.token_logprobs(np.einsum("btd,dv->btv", hidden, unembed), tokens),
      atol=1e-4,
    )

  def test_temperature_and_bf16(self):
    rng = np.random.default_rng(1)
    hidden = jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.bfloat16)
    unembed = jnp.asarray(rng.normal(size=(8, 30)), jnp.bfloat16)
    tokens = rng.integers(0, 30, (2, 5))
    got = logprobs.chunked_token_logprobs(hidden, unembed, tokens, chunk_size=2, temperature=0.5)
    self.assertEqual(got.dtype, jnp.float32)
    logits = np.einsum(
      "btd,dv->btv", np.asarray(hidden, np.float64), np.asarray(unembed, np.float64)
    )
    np.testing.assert_allclose(got, reference.token_logprobs(logits, tokens, 0.5), atol=1e-3)
    grads = jax.grad(
      lambda h, w: jnp.sum(logprobs.chunked_token_logprobs(h, w, tokens, chunk_size=2)),
      argnums=(0, 1),
    )(hidden, unembed)
    self.assertEqual([g.dtype for g in grads], [jnp.bfloat16, jnp.bfloat16])

  def test_never_materialises_full_logits(self):
    b, t, d, v, chunk = 2, 64, 8, 512, 4
    hidden, unembed = jnp.zeros((b, t, d)), jnp.zeros((d, v))
    tokens = jnp.zeros((b, t), int)
    fn = jax.value_and_grad(
      lambda h, w: jnp.sum(logprobs.chunked_token_logprobs(h, w, tokens, chunk_size=chunk)),
      argnums=(0, 1),
    )
    largest = max(_intermediate_sizes(jax.make_jaxpr(fn)(hidden, unembed).jaxpr))
    self.assertLessEqual(largest, b * chunk * v)
    dense = jax.value_and_grad(lambda h, w: jnp.sum(_dense_logp(h, w, tokens)), argnums=(0, 1))
    self.assertGreaterEqual(
      max(_intermediate_sizes(jax.make_jaxpr(dense)(hidden, unembed).jaxpr)), b * t * v
    )

  def test_backward_holds_no_vocabulary_sized_float32_accumulator(self):
    """XLA's compiled temporaries of the gradient stay below one [D, V] float32
    array (the d unembed columns are written in place, chunk by chunk)."""
    b, t, d, v = 2, 32, 64, 50000
    args = (
      jax.ShapeDtypeStruct((b, t, d), jnp.float32),
      jax.ShapeDtypeStruct((d, v), jnp.float32),
      jax.ShapeDtypeStruct((b, t), jnp.int32),
    )
    grad = jax.jit(
      jax.grad(
        lambda h, w, tok: jnp.sum(logprobs.chunked_token_logprobs(h, w, tok, chunk_size=4)),
        argnums=(0, 1),
      )
    )
    temp = grad.lower(*args).compile().memory_analysis().temp_size_in_bytes
    self.assertLess(temp, 0.75 * d * v * 4)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(  # every pair of settings at least once
    (0, False, 1, 1.0),
    (0, True, 3, 0.6),
    (0, False, 16, 0.6),
    (2, True, 1, 0.6),
    (2, False, 3, 1.0),
    (2, True, 16, 1.0),
    (3, False, 1, 0.6),
    (3, True, 3, 1.0),
    (3, True, 16, 0.6),
    (0, True, 1, 1.0),
    (2, False, 1, 0.6),
    (3, False, 3, 0.6),
    (1, False, 3, 0.6),
    (1, True, 16, 1.0),
  )
  def test_logprobs_and_entropy_with_actions_match_dense(
    self, allowed_rank, vocab_major, chunk_size, temperature
  ):
    rng = np.random.default_rng(2)
    b, t, d, v = 2, 7, 8, 24
    hidden, unembed, allowed, full, tokens, (w_logp, w_entropy) = _head_case(
      rng, b, t, d, v, allowed_rank
    )
    stored = unembed.T if vocab_major else unembed

    def chunked(h, w):
      return logprobs.chunked_token_logprobs_and_entropy(
        h,
        w,
        tokens,
        chunk_size=chunk_size,
        temperature=temperature,
        allowed=allowed,
        vocab_major=vocab_major,
      )

    def dense(h, w):
      logits = jnp.einsum("btd,vd->btv" if vocab_major else "btd,dv->btv", h, w) / temperature
      logits = logits if allowed is None else jnp.where(allowed, logits, -jnp.inf)
      return logprobs.token_logprobs(logits, tokens), logprobs.token_entropy(logits)

    def objective(fn):
      return lambda h, w: sum(jnp.sum(x * y) for x, y in zip((w_logp, w_entropy), fn(h, w)))

    got = self.variant(jax.value_and_grad(objective(chunked), argnums=(0, 1)))(hidden, stored)
    want = jax.value_and_grad(objective(dense), argnums=(0, 1))(hidden, stored)
    chex.assert_trees_all_close(got, want, atol=1e-4, rtol=1e-4)
    logits = np.einsum("btd,dv->btv", hidden.astype(np.float64), unembed) / temperature
    logits = np.where(full, logits, -np.inf)
    logp, entropy = self.variant(chunked)(hidden, stored)
    np.testing.assert_allclose(logp, reference.token_logprobs(logits, tokens), atol=1e-4)
    np.testing.assert_allclose(entropy, reference.token_entropy(logits), atol=1e-4)
    only_logp = logprobs.chunked_token_logprobs(
      hidden,
      stored,
      tokens,
      chunk_size=chunk_size,
      temperature=temperature,
      allowed=allowed,
      vocab_major=vocab_major,
    )
    np.testing.assert_allclose(only_logp, logp, atol=1e-6)

  def test_entropy_head_never_materialises_full_logits(self):
    b, t, d, v, chunk = 2, 64, 8, 512, 4
    hidden, embedding = jnp.zeros((b, t, d)), jnp.zeros((v, d))
    tokens = jnp.zeros((b, t), int)
    fn = jax.value_and_grad(
      lambda h, w: jnp.sum(
        sum(
          logprobs.chunked_token_logprobs_and_entropy(
            h, w, tokens, chunk_size=chunk, vocab_major=True, allowed=jnp.ones((t, v), bool)
          )
        )
      ),
      argnums=(0, 1),
    )
    sizes = list(_intermediate_sizes(jax.make_jaxpr(fn)(hidden, embedding).jaxpr))
    self.assertLessEqual(max(sizes), max(b * chunk * v, t * v))  # t * v: the allowed table itself

  def test_bad_input_raises(self):
    with pytest.raises(
      ValueError,
      match=r"allowed must be \[V\], \[T, V\] or \[B, T, V\] = \[1, 2, 5\], got \[3, 5\]",
    ):
      logprobs.chunked_token_logprobs_and_entropy(
        jnp.zeros((1, 2, 8)),
        jnp.zeros((8, 5)),
        jnp.zeros((1, 2), int),
        chunk_size=1,
        allowed=jnp.ones((3, 5), bool),
      )
    with pytest.raises(ValueError, match=r"unembed\[V,D\]"):
      logprobs.chunked_token_logprobs(
        jnp.zeros((1, 2, 8)),
        jnp.zeros((8, 5)),
        jnp.zeros((1, 2), int),
        chunk_size=1,
        vocab_major=True,
      )
    with pytest.raises(ValueError, match=r"unembed\[9, 5\]"):
      logprobs.chunked_token_logprobs(
        jnp.zeros((1, 2, 8)), jnp.zeros((9, 5)), jnp.zeros((1, 2), int), chunk_size=1
      )
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
      logprobs.chunked_token_logprobs(
        jnp.zeros((1, 2, 8)), jnp.zeros((8, 5)), jnp.zeros((1, 2), int), chunk_size=0
      )


class ScoredPositionsTest(parameterized.TestCase):
  """chunked_token_logprobs(_and_entropy) with `where`: only the scored positions
  are computed, packed to the front of each block of rows."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
    (0, 1, 3, False), (3, 2, 1, True), (0, 2, 16, True), (3, 1, 16, False), (3, 4, 3, False)
  )
  def test_scored_positions_match_dense_and_the_rest_is_zero(
    self, allowed_rank, row_blocks, chunk_size, vocab_major
  ):
    rng = np.random.default_rng(3)
    b, t, d, v = 4, 9, 8, 24
    hidden, unembed, allowed, full, tokens, (w_logp, w_entropy) = _head_case(
      rng, b, t, d, v, allowed_rank
    )
    where = rng.random((b, t)) < 0.4
    where[1] = False  # a row with nothing scored
    where[2] = True  # and one with everything
    hidden[~where] = np.nan  # unscored positions never reach a scored result or a gradient
    stored = unembed.T if vocab_major else unembed

    def chunked(h, w):
      return logprobs.chunked_token_logprobs_and_entropy(
        h,
        w,
        tokens,
        chunk_size=chunk_size,
        allowed=allowed,
        vocab_major=vocab_major,
        where=where,
        row_blocks=row_blocks,
      )

    def dense(h, w):
      h = jnp.where(where[..., None], h, 0.0)
      logits = jnp.einsum("btd,vd->btv" if vocab_major else "btd,dv->btv", h, w)
      logits = logits if allowed is None else jnp.where(allowed, logits, -jnp.inf)
      return logprobs.token_logprobs(logits, tokens), logprobs.token_entropy(logits)

    def objective(fn):
      return lambda h, w: sum(
        jnp.sum(jnp.where(where, x * y, 0.0)) for x, y in zip((w_logp, w_entropy), fn(h, w))
      )

    value, grads = self.variant(jax.value_and_grad(objective(chunked), argnums=(0, 1)))(
      hidden, stored
    )
    want_value, want_grads = jax.value_and_grad(objective(dense), argnums=(0, 1))(hidden, stored)
    np.testing.assert_allclose(value, want_value, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(grads[1], want_grads[1], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(grads[0][where], want_grads[0][where], atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(grads[0][~where], 0.0)
    logp, entropy = self.variant(chunked)(hidden, stored)
    logits = np.einsum(
      "btd,dv->btv", np.where(where[..., None], hidden, 0.0).astype(np.float64), unembed
    )
    logits = np.where(full, logits, -np.inf)
    np.testing.assert_allclose(
      logp, np.where(where, reference.token_logprobs(logits, tokens), 0.0), atol=1e-4
    )
    np.testing.assert_allclose(
      entropy, np.where(where, reference.token_entropy(logits), 0.0), atol=1e-4
    )

  def test_nothing_scored_gives_zeros_and_zero_gradients(self):
    hidden, unembed = jnp.ones((2, 5, 4)), jnp.ones((4, 7))
    tokens, where = jnp.zeros((2, 5), int), jnp.zeros((2, 5), bool)
    fn = lambda h, w: jnp.sum(
      logprobs.chunked_token_logprobs(h, w, tokens, chunk_size=2, where=where)
    )
    value, grads = jax.jit(jax.value_and_grad(fn, argnums=(0, 1)))(hidden, unembed)
    self.assertEqual(float(value), 0.0)
    for g in grads:
      np.testing.assert_array_equal(g, 0.0)

  def test_bad_where_or_row_blocks_raise(self):
    args = (jnp.zeros((2, 3, 4)), jnp.zeros((4, 5)), jnp.zeros((2, 3), int))
    with pytest.raises(ValueError, match=r"where must be None or \[B, T\] = \[2, 3\]"):
      logprobs.chunked_token_logprobs(*args, chunk_size=1, where=jnp.ones((3, 2), bool))
    with pytest.raises(
      ValueError, match="row_blocks must be a positive int dividing the batch B = 2"
    ):
      logprobs.chunked_token_logprobs(*args, chunk_size=1, row_blocks=3)
