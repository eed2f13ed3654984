"""Blockwise attention equals the naive one and a float64 NumPy reference, forward and gradient."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxcredit.models import Transformer, preset
from jaxcredit.models.attention import attention
from tests.unit.test_logprobs import _intermediate_sizes


def _reference(q, k, v, query_slots, key_valid):
  """float64 softmax attention, keys and values [B, KV, S, hd]; a query that sees no key
  gets zeros."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  scores = np.einsum("btkgd,bksd->bkgts", q, k) / np.sqrt(q.shape[-1])
  visible = (np.arange(k.shape[2])[None, :] <= np.asarray(query_slots)[:, None])[None]
  visible = visible & np.asarray(key_valid)[:, None, :]
  scores = np.where(visible[:, None, None], scores, -np.inf)
  seen = visible.any(-1)[:, None, None, :, None]
  scores = np.where(seen, scores, 0.0)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs = np.where(seen, probs / probs.sum(-1, keepdims=True), 0.0)  # no key seen: zeros
  return np.einsum("bkgts,bksd->btkgd", probs, v)


def _inputs(b, t, s, n_kv, group, hd, seed=0, dtype=np.float32):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, t, n_kv, group, hd)).astype(dtype)
  k = rng.normal(size=(b, n_kv, s, hd)).astype(dtype)
  v = rng.normal(size=(b, n_kv, s, hd)).astype(dtype)
  # Ragged: left padding of random length, then random holes; one row fully padded.
  key_valid = np.arange(s)[None] >= rng.integers(0, s // 2 + 1, (b, 1))
  key_valid &= rng.random((b, s)) > 0.15
  key_valid[-1] = False
  query_slots = np.arange(s - t, s)  # the queries are the last t slots (t < s: decoding)
  return q, k, v, query_slots, key_valid


class AttentionTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
      dict(b=2, t=13, s=13, n_kv=2, group=2, hd=8, block=4),   # blocks that do not divide T
      dict(b=3, t=32, s=32, n_kv=1, group=4, hd=16, block=8),  # one KV head
      dict(b=2, t=1, s=29, n_kv=2, group=3, hd=8, block=8),    # a decode step against a cache
      dict(b=2, t=5, s=40, n_kv=2, group=1, hd=8, block=16),   # a prefill into a longer cache
      dict(b=1, t=7, s=7, n_kv=1, group=1, hd=4, block=512),   # one block
  )
  def test_forward_and_gradient_equal_naive(self, b, t, s, n_kv, group, hd, block):
    q, k, v, query_slots, key_valid = _inputs(b, t, s, n_kv, group, hd)
    run = lambda impl: self.variant(lambda q, k, v: attention(
        q, k, v, query_slots, key_valid, implementation=impl, block_size=block))
    want = _reference(q, k, v, query_slots, key_valid)
    for impl in ("chunked", "xla"):
      np.testing.assert_allclose(run(impl)(q, k, v), want, atol=1e-5, rtol=1e-5, err_msg=impl)
    weights = np.random.default_rng(1).normal(size=want.shape).astype(np.float32)
    grad = lambda impl: jax.grad(lambda *x: jnp.sum(weights * run(impl)(*x)), argnums=(0, 1, 2))(
      q, k, v
    )
    chex.assert_trees_all_close(grad("chunked"), grad("xla"), atol=1e-5, rtol=1e-5)

  def test_bf16_within_tolerance(self):
    q, k, v, query_slots, key_valid = _inputs(2, 24, 24, 2, 2, 16, dtype=np.float32)
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    got = attention(q, k, v, query_slots, key_valid, implementation="chunked", block_size=8)
    self.assertEqual(got.dtype, jnp.bfloat16)
    want = _reference(
      q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), query_slots, key_valid
    )
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=2e-2, rtol=2e-2)

  def test_memory_is_linear_in_length(self):
    """The gradient's largest intermediate is an input-sized array: scores are held
    one [block, block] tile at a time, never [T, S] nor [block, S]."""
    b, t, n_kv, group, hd, block = 1, 256, 1, 2, 8, 32
    q, k, v, query_slots, key_valid = _inputs(b, t, t, n_kv, group, hd)

    def largest(impl):
      fn = jax.grad(
        lambda q, k, v: jnp.sum(
          attention(q, k, v, query_slots, key_valid, implementation=impl, block_size=block)
        ),
        argnums=(0, 1, 2),
      )
      return max(_intermediate_sizes(jax.make_jaxpr(fn)(q, k, v).jaxpr))

    self.assertGreaterEqual(largest("xla"), b * n_kv * group * t * t)
    self.assertLessEqual(largest("chunked"), max(q.size, b * n_kv * group * block * block))

  def test_unknown_implementation_is_refused(self):
    with pytest.raises(
      ValueError, match="Unknown attention .flash.; known: chunked, xla, cudnn, splash"
    ):
      preset("tiny", attention="flash")
    with pytest.raises(ValueError, match="attention_block must be a positive int"):
      preset("tiny", attention_block=0)


def test_models_agree_across_implementations():
  """Teacher forcing and cached decoding give the same logits with either attention."""
  from flax import nnx

  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 20)))
  valid = jnp.asarray(np.arange(20)[None] >= np.array([[0], [6]]))
  outs = {}
  for impl in ("xla", "chunked"):
    model = Transformer(preset("tiny", attention=impl, attention_block=8), rngs=nnx.Rngs(0))
    outs[impl] = model(tokens, token_valid=valid).logits
  np.testing.assert_allclose(outs["chunked"], outs["xla"], atol=1e-5, rtol=1e-5)


def test_fused_kernel_layout_equals_naive():
  """The cuDNN path's call of jax.nn.dot_product_attention (grouped heads, slot mask),
  run with jax's XLA implementation on CPU, equals the naive attention, forward
  and gradient."""
  from jaxcredit.models.attention import _fused

  q, k, v, query_slots, key_valid = _inputs(2, 9, 9, 2, 3, 8)
  np.testing.assert_allclose(
    _fused(q, k, v, query_slots, key_valid, "xla"),
    _reference(q, k, v, query_slots, key_valid),
    atol=1e-5,
    rtol=1e-5,
  )
  weights = np.random.default_rng(1).normal(size=q.shape).astype(np.float32)
  grad = lambda f: jax.grad(lambda *x: jnp.sum(weights * f(*x)), argnums=(0, 1, 2))(q, k, v)
  chex.assert_trees_all_close(
    grad(lambda *x: _fused(*x, query_slots, key_valid, "xla")),
    grad(lambda *x: attention(*x, query_slots, key_valid, implementation="xla")),
    atol=1e-5,
    rtol=1e-5,
  )


def test_an_unavailable_or_too_long_configuration_is_refused():
  from flax import nnx

  q, k, v, query_slots, key_valid = _inputs(1, 4, 4, 1, 1, 4)
  if jax.default_backend() != "gpu":
    with pytest.raises(ValueError, match="model.attention='cudnn' .* needs a CUDA GPU.*'chunked'"):
      attention(q, k, v, query_slots, key_valid, implementation="cudnn")
  if jax.default_backend() != "tpu":
    with pytest.raises(ValueError, match="model.attention='splash' .* needs a TPU.*'chunked'"):
      attention(q, k, v, query_slots, key_valid, implementation="splash")
  model = Transformer(preset("tiny", max_position=16), rngs=nnx.Rngs(0))
  model(jnp.zeros((1, 16), jnp.int32))
  with pytest.raises(ValueError, match="A row of 17 tokens is longer than model.max_position = 16"):
    model(jnp.zeros((1, 17), jnp.int32))
  from jaxcredit.models import KVCache

  with pytest.raises(ValueError, match="model.max_position = 16"):
    model.decode(
      jnp.zeros((1, 1), jnp.int32),
      jnp.zeros((1, 1), jnp.int32),
      jnp.ones((1, 1), bool),
      KVCache.zeros(model.config, 1, 32),
      0,
    )
  with pytest.raises(ValueError, match="max_position must be a positive int or None"):
    preset("tiny", max_position=0)


@pytest.mark.parametrize("t,block", [(256, 128), (200, 512)])  # a multiple of the block; padded
def test_splash_kernel_equals_naive_on_real_tokens(t, block):
  """The TPU splash path, run in Pallas interpret mode on CPU: forward and
  gradient equal the naive attention at every real (non-padding) query."""
  from jaxcredit.models.attention import _splash

  q, k, v, _, key_valid = _inputs(2, t, t, 2, 2, 8)
  key_valid[-1, :40] = False  # the last row: left padding, then every token real
  key_valid[-1, 40:] = True
  query_slots = np.arange(t)
  real = jnp.asarray(key_valid)[:, :, None, None, None]
  weights = np.random.default_rng(1).normal(size=q.shape).astype(np.float32)
  splash = lambda q, k, v: _splash(q, k, v, jnp.asarray(key_valid), block, interpret=True)
  naive = lambda q, k, v: attention(q, k, v, query_slots, key_valid, implementation="xla")
  np.testing.assert_allclose(
    jnp.where(real, splash(q, k, v), 0), jnp.where(real, naive(q, k, v), 0), atol=1e-5, rtol=1e-5
  )
  grad = lambda f: jax.grad(
    lambda *x: jnp.sum(jnp.where(real, weights * f(*x), 0)), argnums=(0, 1, 2)
  )(q, k, v)
  chex.assert_trees_all_close(grad(splash), grad(naive), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("t,s,block", [(1, 40, 8), (5, 40, 8), (16, 16, 4)])
def test_blockwise_reads_no_key_block_after_a_query_blocks_last_slot(t, s, block):
  """A query block reads the key blocks up to its last slot only (a decode step reads the
  written slots of its cache, a teacher-forced pass the lower triangle of blocks): NaN keys
  and values in a later block, at slots no query sees, reach neither the earlier query
  blocks' outputs nor their gradient. Naive attention would read them (0 * NaN)."""
  q, k, v, _, key_valid = _inputs(2, t, s, 2, 2, 8)
  query_slots = np.arange(t) + (s // 2 if t < s else 0)
  unread = (query_slots[-1] // block + 1) * block if t < s else s - block  # a block's start
  k[:, :, unread:], v[:, :, unread:] = np.nan, np.nan
  key_valid[:, unread:] = False
  rows = query_slots < unread  # the queries whose blocks end before the NaN
  want = _reference(q, np.nan_to_num(k), np.nan_to_num(v), query_slots, key_valid)
  run = lambda q, k, v: attention(q, k, v, query_slots, key_valid, implementation="chunked",
                                  block_size=block)
  np.testing.assert_allclose(jax.jit(run)(q, k, v)[:, rows], want[:, rows], atol=1e-5, rtol=1e-5)
  d_q, d_k, d_v = jax.grad(lambda *x: jnp.sum(run(*x)[:, rows]), argnums=(0, 1, 2))(q, k, v)
  assert np.isfinite(d_q[:, rows]).all()
  if rows.all():  # no query reads the NaN block (under teacher forcing the last one does)
    assert np.isfinite(d_k[:, :, :unread]).all() and np.isfinite(d_v[:, :, :unread]).all()
  naive = attention(q, k, v, query_slots, key_valid, implementation="xla")
  assert np.isnan(np.asarray(naive)[:, rows]).any()  # the control: reading them poisons


@pytest.mark.parametrize("impl,s,block", [("chunked", 40, 8), ("chunked", 29, 8),
                                          ("chunked", 8, 8), ("xla", 40, 8)])
def test_a_stacked_cache_read_at_a_layer_equals_that_layers_keys(impl, s, block):
  """`layer`: keys and values [n_layers, B, KV, S, hd], the layer's read in place (chunked,
  S a multiple of the block) or sliced (otherwise), for a traced layer index too."""
  q, k, v, _, key_valid = _inputs(2, 3, s, 2, 2, 8)
  rng = np.random.default_rng(2)
  stacked_k, stacked_v = (jnp.stack([rng.normal(size=x.shape).astype(np.float32), x, x + 1])
                          for x in (k, v))
  query_slots = np.arange(3) + s // 2
  want = attention(q, k, v, query_slots, key_valid, implementation=impl, block_size=block)
  run = jax.jit(lambda layer: attention(q, stacked_k, stacked_v, query_slots, key_valid,
                                        implementation=impl, block_size=block, layer=layer))
  np.testing.assert_allclose(run(1), want, atol=1e-6, rtol=1e-6)
  np.testing.assert_allclose(run(0)[:, :1], _reference(q, stacked_k[0], stacked_v[0],
                                                       query_slots, key_valid)[:, :1],
                             atol=1e-5, rtol=1e-5)
