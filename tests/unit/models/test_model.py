"""The NNX transformer against an independent float64 NumPy forward pass."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models.config import RopeScaling, preset
from jaxcredit.models.transformer import KVCache, Transformer

TINY = preset("tiny")
VARIANTS = {
  "tied": TINY,
  "untied+bias+value": TINY.replace(
    tie_embeddings=False, qkv_bias=True, value_head=True, n_kv_heads=4
  ),
}
# transformers is the reference for these (tests/unit/models/test_hf_parity.py); here the
# cache path must agree.
CACHED_VARIANTS = {
  **VARIANTS,
  "qk_norm+head_dim+llama3_rope": TINY.replace(
    qk_norm=True,
    head_dim=48,
    rope_scaling=RopeScaling(
      factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16
    ),
  ),
}


def _params(model) -> dict:
  return jax.tree.map(
    lambda x: np.asarray(x, np.float64), nnx.to_pure_dict(nnx.state(model, nnx.Param))
  )


def numpy_forward(params, config, tokens, positions, token_valid):
  """Reference: embed, L x (RMSNorm, RoPE GQA attention, SwiGLU), RMSNorm, unembed."""
  hd, n_h, n_kv = config.resolved_head_dim, config.n_heads, config.n_kv_heads

  def norm(x, w):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + config.norm_eps) * w

  def linear(p, x):
    return x @ p["kernel"] + p.get("bias", 0.0)

  def rotate(x):  # x [B, T, H, hd]
    half = hd // 2
    freq = config.rope_theta ** (-np.arange(half) / half)
    ang = positions[..., None] * freq
    cos, sin = np.cos(ang)[:, :, None], np.sin(ang)[:, :, None]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

  b, t = tokens.shape
  x = params["embed_tokens"]["embedding"][tokens]
  allowed = np.tril(np.ones((t, t), bool))[None] & token_valid[:, None, :]
  for i in range(config.n_layers):
    layer = jax.tree.map(lambda x: x[i], params["layers"])  # stacked on a leading layer axis
    h = norm(x, layer["input_layernorm"]["weight"])
    att = layer["self_attn"]
    q = rotate(linear(att["q_proj"], h).reshape(b, t, n_h, hd))
    k = rotate(linear(att["k_proj"], h).reshape(b, t, n_kv, hd))
    v = linear(att["v_proj"], h).reshape(b, t, n_kv, hd)
    k, v = np.repeat(k, n_h // n_kv, axis=2), np.repeat(v, n_h // n_kv, axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(hd)
    scores = np.where(allowed[:, None], scores, -1e30)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, n_h * hd)
    x = x + linear(att["o_proj"], out)
    mlp = layer["mlp"]
    h = norm(x, layer["post_attention_layernorm"]["weight"])
    gate = linear(mlp["gate_proj"], h)
    x = x + linear(mlp["down_proj"], gate / (1 + np.exp(-gate)) * linear(mlp["up_proj"], h))
  hidden = norm(x, params["norm"]["weight"])
  unembed = (
    params["embed_tokens"]["embedding"].T if config.tie_embeddings else params["lm_head"]["kernel"]
  )
  values = linear(params["value_head"], hidden)[..., 0] if config.value_head else None
  return hidden @ unembed, values


def _perturbed_model(config, seed=0):
  """A model whose norms and biases are random too, so every parameter matters."""
  model = Transformer(config, rngs=nnx.Rngs(seed))
  rng = np.random.default_rng(seed)
  state = nnx.state(model, nnx.Param)
  state = jax.tree.map(lambda x: x + 0.05 * rng.normal(size=x.shape).astype(x.dtype), state)
  nnx.update(model, state)
  return model


def _left_padded_batch(rng, batch, length, vocab):
  tokens = rng.integers(0, vocab, (batch, length))
  n_pad = rng.integers(0, length // 2, batch)
  token_valid = np.arange(length)[None] >= n_pad[:, None]
  positions = np.maximum(np.cumsum(token_valid, 1) - 1, 0)
  return tokens, positions, token_valid


@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_matches_numpy(variant):
  config = VARIANTS[variant]
  model = _perturbed_model(config)
  tokens, positions, token_valid = _left_padded_batch(
    np.random.default_rng(1), 3, 11, config.vocab_size
  )
  out = jax.jit(lambda m, *a: m(a[0], positions=a[1], token_valid=a[2]))(
    model, tokens, positions, token_valid
  )
  want_logits, want_values = numpy_forward(_params(model), config, tokens, positions, token_valid)
  np.testing.assert_allclose(
    np.where(token_valid[..., None], out.logits, 0),
    np.where(token_valid[..., None], want_logits, 0),
    atol=2e-4,
  )
  if config.value_head:
    np.testing.assert_allclose(
      np.where(token_valid, out.values, 0), np.where(token_valid, want_values, 0), atol=2e-4
    )
  np.testing.assert_allclose(out.hidden @ np.asarray(model.unembed), out.logits, atol=1e-3)


def test_left_padding_does_not_change_valid_outputs():
  model = _perturbed_model(TINY, 2)
  tokens = np.random.default_rng(3).integers(0, TINY.vocab_size, (1, 6))
  padded = np.concatenate([np.zeros((1, 3), int), tokens], 1)
  valid = np.arange(9)[None] >= 3
  out = model(
    jnp.asarray(padded),
    positions=jnp.asarray(np.maximum(np.arange(9) - 3, 0))[None],
    token_valid=jnp.asarray(valid),
  )
  np.testing.assert_allclose(out.logits[:, 3:], model(jnp.asarray(tokens)).logits, atol=1e-4)


@pytest.mark.parametrize("variant", CACHED_VARIANTS)
def test_cached_decode_equals_full_forward(variant):
  config = CACHED_VARIANTS[variant]
  model = _perturbed_model(config, 4)
  tokens, positions, token_valid = _left_padded_batch(
    np.random.default_rng(5), 2, 10, config.vocab_size
  )
  full = model(tokens, positions=positions, token_valid=token_valid)
  for layers in (None, model.unstacked_layers()):  # stacked layers sliced per call, or once
    cache = KVCache.zeros(config, 2, 12)
    prefill, cache = model.decode(
      tokens[:, :6], positions[:, :6], token_valid[:, :6], cache, 0, layers=layers
    )
    outs = [prefill.logits]
    for s in range(6, 10):
      step, cache = model.decode(
        tokens[:, s : s + 1],
        positions[:, s : s + 1],
        token_valid[:, s : s + 1],
        cache,
        s,
        layers=layers,
      )
      outs.append(step.logits)
    cached = np.concatenate(outs, 1)
    np.testing.assert_allclose(
      np.where(token_valid[..., None], cached, 0),
      np.where(token_valid[..., None], full.logits, 0),
      atol=2e-4,
    )


def test_bf16_compute_is_close_to_float32():
  model32 = _perturbed_model(TINY, 6)
  model16 = Transformer(TINY.replace(dtype=jnp.bfloat16), rngs=nnx.Rngs(0))
  nnx.update(model16, nnx.state(model32, nnx.Param))
  tokens = jnp.asarray(np.random.default_rng(7).integers(0, TINY.vocab_size, (2, 8)))
  a, b = model32(tokens).logits, model16(tokens).logits
  assert b.dtype == jnp.float32
  np.testing.assert_allclose(a, b, atol=0.1)


def test_bad_configs_raise():
  with pytest.raises(ValueError, match=r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"):
    TINY.replace(n_kv_heads=3)
  with pytest.raises(ValueError, match="Unknown model preset 'huge'"):
    preset("huge")


def test_remat_takes_effect_in_the_compiled_gradient():
  """Scanned layers under jax.checkpoint: the compiled gradient needs fewer
  temporaries; every policy, and the unrolled layers (scan_layers=False), give
  the same outputs and gradient."""
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (4, 64)))
  temps, grads, logits = {}, {}, {}
  for remat, scan in [("none", True), ("block", True), ("dots_saveable", True), ("none", False)]:
    model = Transformer(preset("tiny", n_layers=4, remat=remat, scan_layers=scan), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    loss = lambda s: jnp.sum(jax.nn.log_softmax(nnx.merge(graphdef, s)(tokens).logits)[..., 0])
    grad = jax.jit(jax.grad(loss))
    temps[remat, scan] = grad.lower(state).compile().memory_analysis().temp_size_in_bytes
    grads[remat, scan] = grad(state)
    logits[remat, scan] = model(tokens).logits
  assert temps["block", True] < 0.6 * temps["none", True], temps
  for key in grads:  # entries reach ~300: float32 summation order alone moves them ~1e-5
    chex.assert_trees_all_close(grads[key], grads["none", True], atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(logits[key], logits["none", True], atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="Unknown remat 'all'"):
    preset("tiny", remat="all")
  with pytest.raises(ValueError, match="remat='block' needs scan_layers=True"):
    preset("tiny", remat="block", scan_layers=False)
