"""A decoder-only transformer policy in Flax NNX (Llama / Qwen2 architecture).

Module and parameter names follow the Hugging Face Llama/Qwen2 layout
(`embed_tokens`, `layers.self_attn.q_proj`, `mlp.gate_proj`, `norm`,
`lm_head`), so real checkpoints map one to one; the layers' parameters are
stacked on a leading [n_layers] axis (HF's `layers.{i}`), and the forward
pass scans over them.

Shapes: tokens [B, T]; positions [B, T] (RoPE positions; left-padded prompts
start at 0 after their padding); token_valid [B, T] (False for padding).
Attention is causal over *slots* (array positions): the query in slot s sees
keys in slots <= s that are valid.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import Array

from jaxcredit.models import context_parallel
from jaxcredit.models.attention import attention
from jaxcredit.models.config import REMAT_POLICIES, TransformerConfig
from jaxcredit.models.layers import RMSNorm, rope


class KVCache(NamedTuple):
  """Keys and values of every layer for S slots, and which slots hold tokens.

  Attributes:
    keys: ``[n_layers, B, n_kv_heads, S, head_dim]`` (heads before slots, as attention
      reads them; a decode step writes its slots in place).
    values: ``[n_layers, B, n_kv_heads, S, head_dim]``.
    key_valid: ``[B, S]`` bool.
  """

  keys: Array
  values: Array
  key_valid: Array

  @classmethod
  def zeros(cls, config: TransformerConfig, batch: int, slots: int) -> "KVCache":
    shape = (config.n_layers, batch, config.n_kv_heads, slots, config.resolved_head_dim)
    return cls(keys=jnp.zeros(shape, config.dtype), values=jnp.zeros(shape, config.dtype),
               key_valid=jnp.zeros((batch, slots), bool))

  def rows(self, index: Array) -> "KVCache":
    """The cache of rows `index` (``[R']`` int): row r' copies row index[r'] (copy-on-fork,
    or a prefilled prompt copied into a decode slot)."""
    return KVCache(self.keys[:, index], self.values[:, index], self.key_valid[index])


class ModelOutput(NamedTuple):
  """What a forward pass returns.

  Attributes:
    logits: ``[B, T, V]`` float32, or None when not requested.
    hidden: ``[B, T, D]`` after the final norm.
    values: ``[B, T]`` float32, or None without a value head.
  """

  logits: Array | None
  hidden: Array
  values: Array | None


def _linear(config: TransformerConfig, d_in: int, d_out: int, *, bias: bool,
            rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(
      d_in, d_out, use_bias=bias, dtype=config.dtype, param_dtype=config.param_dtype,
      kernel_init=nnx.initializers.normal(0.02), rngs=rngs,
  )


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE and an optional KV cache.

  Args:
    config: the architecture (`TransformerConfig`).
    rngs: the initialisation's `nnx.Rngs`.
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.config = config
    d, hd = config.d_model, config.resolved_head_dim
    self.q_proj = _linear(config, d, config.n_heads * hd, bias=config.qkv_bias, rngs=rngs)
    self.k_proj = _linear(config, d, config.n_kv_heads * hd, bias=config.qkv_bias, rngs=rngs)
    self.v_proj = _linear(config, d, config.n_kv_heads * hd, bias=config.qkv_bias, rngs=rngs)
    self.o_proj = _linear(config, config.n_heads * hd, d, bias=False, rngs=rngs)
    if config.qk_norm:
      self.q_norm = RMSNorm(hd, eps=config.norm_eps, param_dtype=config.param_dtype)
      self.k_norm = RMSNorm(hd, eps=config.norm_eps, param_dtype=config.param_dtype)

  def __call__(self, x, positions, query_slots, key_valid, cache, slot):
    """x [B, T, D]; query_slots [T] (the queries' slots); key_valid [B, S];
    cache: None (the keys are this call's own) or (keys, values, layer) with
    keys/values [n_layers, B, KV, S, hd], this layer's at index `layer`.

    Returns (output [B, T, D], cache) with this step's keys/values written at
    slots [slot, slot + T) of the layer (`slot` an int, or [B] per row with T = 1).
    """
    cfg = self.config
    b, t, _ = x.shape
    hd, n_kv = cfg.resolved_head_dim, cfg.n_kv_heads
    group = cfg.n_heads // n_kv
    q = self.q_proj(x).reshape(b, t, cfg.n_heads, hd)
    k = self.k_proj(x).reshape(b, t, n_kv, hd)
    if cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q = rope(q, positions, cfg.rope_theta, cfg.rope_scaling)
    k = rope(k, positions, cfg.rope_theta, cfg.rope_scaling)
    v = self.v_proj(x).reshape(b, t, n_kv, hd)
    k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [B, KV, T, hd], as attention reads
    if cache is None:
      keys, values, layer = k, v, None
    else:  # attention reads this layer's keys from the stacked cache
      all_keys, all_values, layer = cache
      write = functools.partial(_write_slots, layer=layer, slot=slot)
      keys, values = write(all_keys, k), write(all_values, v)
      cache = (keys, values, layer)
    sharded = cache is None and context_parallel.sequence_shards() > 1
    implementation = cfg.attention
    if implementation == "splash" and (cache is not None or sharded):
      implementation = "chunked"  # splash attends a whole unsharded row to itself only
    attend = functools.partial(attention, implementation=implementation,
                               block_size=cfg.attention_block, layer=layer)
    if cache is None:  # teacher-forced rows may be sharded along the sequence
      attend = context_parallel.sequence_sharded(attend)
    out = attend(q.reshape(b, t, n_kv, group, hd), keys, values, query_slots, key_valid)
    return self.o_proj(out.reshape(b, t, cfg.n_heads * hd).astype(x.dtype)), cache


def _write_slots(stored: Array, new: Array, *, layer, slot) -> Array:
  """stored [n_layers, B, KV, S, hd] with new [B, KV, T, hd] written at layer `layer`, slots
  [slot, slot + T): one int slot for every row, or a [B] slot per row (T = 1)."""
  new = new.astype(stored.dtype)
  if jnp.ndim(slot) == 1:
    return stored.at[layer, jnp.arange(new.shape[0]), :, slot].set(new[:, :, 0])
  return jax.lax.dynamic_update_slice(stored, new[None], (layer, 0, 0, slot, 0))


class MLP(nnx.Module):
  """SwiGLU: ``down(silu(gate(x)) * up(x))``.

  Args:
    config: the architecture (`TransformerConfig`).
    rngs: the initialisation's `nnx.Rngs`.

  References:
    Shazeer, 2020, "GLU Variants Improve Transformer", arXiv 2002.05202.
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.gate_proj = _linear(config, config.d_model, config.d_ff, bias=False, rngs=rngs)
    self.up_proj = _linear(config, config.d_model, config.d_ff, bias=False, rngs=rngs)
    self.down_proj = _linear(config, config.d_ff, config.d_model, bias=False, rngs=rngs)

  def __call__(self, x: Array) -> Array:
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):
  """Pre-norm residual block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``.

  Args:
    config: the architecture (`TransformerConfig`).
    rngs: the initialisation's `nnx.Rngs`.
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.input_layernorm = RMSNorm(config.d_model, eps=config.norm_eps,
                                   param_dtype=config.param_dtype)
    self.self_attn = Attention(config, rngs=rngs)
    self.post_attention_layernorm = RMSNorm(config.d_model, eps=config.norm_eps,
                                            param_dtype=config.param_dtype)
    self.mlp = MLP(config, rngs=rngs)

  def __call__(self, x, positions, query_slots, key_valid, cache, slot):
    attended, cache = self.self_attn(self.input_layernorm(x), positions, query_slots, key_valid,
                                     cache, slot)
    x = x + attended
    return x + self.mlp(self.post_attention_layernorm(x)), cache


def stacked_blocks(config: TransformerConfig, rngs: nnx.Rngs) -> Block:
  """``n_layers`` Blocks initialised one after another, their parameters stacked on a leading
  layer axis for `lax.scan` over depth.

  Args:
    config: the model's `TransformerConfig`.
    rngs: the initialisation's `nnx.Rngs`.

  Returns:
    one `Block` whose parameters are ``[n_layers, ...]``.
  """
  blocks = [Block(config, rngs=rngs) for _ in range(config.n_layers)]
  graphdef = nnx.split(blocks[0])[0]
  states = [nnx.split(block)[1] for block in blocks]
  return nnx.merge(graphdef, jax.tree.map(lambda *layers: jnp.stack(layers), *states))


class Transformer(nnx.Module):
  """The policy: token ids -> logits (and hidden states, and values with a value head).

  Args:
    config: the architecture (`TransformerConfig`).
    rngs: the initialisation's `nnx.Rngs`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxcredit import models
    >>> model = models.Transformer(models.preset("tiny"), rngs=nnx.Rngs(0))
    >>> tokens = jnp.ones((2, 5), jnp.int32)
    >>> out = model(tokens, positions=jnp.broadcast_to(jnp.arange(5), (2, 5)),
    ...             token_valid=jnp.ones((2, 5), bool))
    >>> out.logits.shape, out.hidden.shape
    ((2, 5, 64), (2, 5, 128))
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.embed_tokens = nnx.Embed(
        config.vocab_size, config.d_model, dtype=config.dtype, param_dtype=config.param_dtype,
        embedding_init=nnx.initializers.normal(0.02), rngs=rngs,
    )
    self.layers = stacked_blocks(config, rngs)
    self.norm = RMSNorm(config.d_model, eps=config.norm_eps, param_dtype=config.param_dtype)
    self.lm_head = (
        None if config.tie_embeddings
        else _linear(config, config.d_model, config.vocab_size, bias=False, rngs=rngs)
    )
    self.value_head = (
        nnx.Linear(config.d_model, 1, param_dtype=config.param_dtype,
                   kernel_init=nnx.initializers.zeros_init(), rngs=rngs)
        if config.value_head else None
    )

  @property
  def unembedding(self) -> tuple[Array, bool]:
    """(matrix, vocab_major): the unembedding as stored - the tied embedding table
    [V, D] (vocab_major=True) or the lm_head kernel [D, V] - for
    `chunked_token_logprobs(..., vocab_major=...)` without a transposed copy."""
    if self.lm_head is None:
      return self.embed_tokens.embedding[...], True
    return self.lm_head.kernel[...], False

  @property
  def unembed(self) -> Array:
    """The unembedding matrix [D, V] (for `chunked_token_logprobs`)."""
    if self.lm_head is None:
      return self.embed_tokens.embedding[...].T
    return self.lm_head.kernel[...]

  def __call__(
      self,
      tokens: Array,
      *,
      positions: Array | None = None,
      token_valid: Array | None = None,
      logits: bool = True,
  ) -> ModelOutput:
    """Teacher-forced forward over [B, T] tokens (no cache).

    positions default to 0..T-1; token_valid (default all True) hides padding
    from attention. logits=False skips the [B, T, V] projection. Under a mesh
    with a `sequence` axis the rows are sharded along T (`context_parallel`).
    T > config.max_position is refused (ValueError).
    """
    b, t = tokens.shape
    self.config.check_length(t)
    positions = jnp.broadcast_to(jnp.arange(t), (b, t)) if positions is None else positions
    token_valid = jnp.ones((b, t), bool) if token_valid is None else token_valid
    embedded = context_parallel.constrain(self.embed_tokens(tokens))
    hidden, _ = self._blocks(embedded, positions, jnp.arange(t), token_valid, None, 0)
    return self._outputs(self.norm(hidden), logits)

  def decode(
      self,
      tokens: Array,
      positions: Array,
      token_valid: Array,
      cache: KVCache,
      slot: Array | int,
      *,
      logits: bool = True,
      layers: list | None = None,
  ) -> tuple[ModelOutput, KVCache]:
    """Forward T new tokens written at cache slots [slot, slot + T).

    Each attends to the cache's valid slots up to its own. Returns the
    outputs for these tokens and the updated cache. A cache of more slots than
    config.max_position is refused (ValueError). layers: `unstacked_layers()`,
    taken once before a decode loop, or None to slice the stacked layers here.
    `slot` may be a [B] array, a slot per row, for one token per row (T = 1):
    each row then attends to every valid slot of its own, so a row must hold no
    valid slot after its own (continuous batching's slots, `sampling.continuous`); the
    key blocks read are those up to the furthest row's slot.
    """
    b, t = tokens.shape
    slots = cache.key_valid.shape[1]
    self.config.check_length(slots)
    if jnp.ndim(slot) == 1:
      if t != 1:
        raise ValueError(f"decode: a slot per row writes one token per row, got {t}.")
      key_valid = cache.key_valid.at[jnp.arange(b), slot].set(token_valid[:, 0])
      query_slots = jnp.max(slot, keepdims=True)
    else:
      key_valid = jax.lax.dynamic_update_slice(cache.key_valid, token_valid, (0, slot))
      query_slots = slot + jnp.arange(t)
    hidden, (keys, values) = self._blocks(self.embed_tokens(tokens), positions, query_slots,
                                          key_valid, (cache.keys, cache.values), slot, layers)
    return self._outputs(self.norm(hidden), logits), KVCache(keys, values, key_valid)

  def unstacked_layers(self) -> list:
    """Each layer's parameters as arrays of their own. XLA:CPU copies a slice of
    the stacked weights before using it, so a decode loop that slices them at
    every token moves every weight three times per token; slicing once before
    the loop leaves one read."""
    stacked = nnx.state(self.layers)
    return [jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(self.config.n_layers)]

  def _blocks(self, hidden, positions, query_slots, key_valid, cache, slot, unstacked=None):
    """Every block in turn: `lax.scan` over the stacked layers (compile time
    independent of depth), or a loop over `unstacked` (`unstacked_layers`;
    taken when config.scan_layers is False).
    Without a cache, each scanned block runs under `jax.checkpoint` with the
    config's remat policy (`REMAT_POLICIES`), so the backward pass keeps only
    what the policy saves of one block at a time.
    cache: None or (keys, values) [n_layers, B, KV, S, hd], updated in place."""
    graphdef, layers = nnx.split(self.layers)

    def block(carry, layer):
      hidden, cache = carry
      params, index = layer
      layer_cache = None if cache is None else (*cache, index)
      hidden, layer_cache = nnx.merge(graphdef, params)(hidden, positions, query_slots,
                                                        key_valid, layer_cache, slot)
      return (hidden, None if cache is None else layer_cache[:2]), None

    if unstacked is None and not self.config.scan_layers:
      unstacked = self.unstacked_layers()
    if unstacked is not None:
      for index, params in enumerate(unstacked):
        (hidden, cache), _ = block((hidden, cache), (params, index))
      return hidden, cache
    policy = REMAT_POLICIES[self.config.remat]
    if cache is None and policy is not None:
      block = jax.checkpoint(block, policy=policy, prevent_cse=False)
    (hidden, cache), _ = jax.lax.scan(block, (hidden, cache),
                                      (layers, jnp.arange(self.config.n_layers)))
    return hidden, cache

  def _outputs(self, hidden: Array, logits: bool) -> ModelOutput:
    values = None
    if self.value_head is not None:
      values = self.value_head(hidden.astype(jnp.float32))[..., 0]
    return ModelOutput(logits=self.logits(hidden) if logits else None, hidden=hidden,
                       values=values)

  def logits(self, hidden: Array) -> Array:
    """[..., V] float32 logits of hidden states [..., D] taken after the final norm
    (`ModelOutput.hidden`)."""
    return jnp.einsum("...d,dv->...v", hidden, self.unembed.astype(hidden.dtype),
                      preferred_element_type=jnp.float32)
