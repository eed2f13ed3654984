"""Transformer configurations and presets (Llama / Qwen2 shapes)."""

import dataclasses

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """A decoder-only transformer: RoPE, RMSNorm, SwiGLU, grouped-query attention.

  vocab_size, d_model, n_layers, n_heads, n_kv_heads (n_heads % n_kv_heads == 0),
  d_ff (SwiGLU hidden width), head_dim (default d_model // n_heads),
  rope_theta, norm_eps, qkv_bias (Qwen2: True, Llama: False),
  tie_embeddings (unembedding = embedding^T), value_head (also return V(s_t)),
  dtype (compute dtype, e.g. bfloat16) and param_dtype (stored weights).
  """

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  d_ff: int
  head_dim: int | None = None
  rope_theta: float = 10000.0
  norm_eps: float = 1e-6
  qkv_bias: bool = False
  tie_embeddings: bool = True
  value_head: bool = False
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  def __post_init__(self):
    if self.n_heads % self.n_kv_heads:
      raise ValueError(
          f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})."
      )
    if self.head_dim is None and self.d_model % self.n_heads:
      raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}).")
    if self.resolved_head_dim % 2:
      raise ValueError(f"RoPE needs an even head_dim, got {self.resolved_head_dim}.")

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim or self.d_model // self.n_heads

  def replace(self, **changes) -> "TransformerConfig":
    return dataclasses.replace(self, **changes)


PRESETS = {
    # Runs in milliseconds on a laptop CPU; the quickstart and tests use it.
    "tiny": TransformerConfig(vocab_size=64, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2,
                              d_ff=256),
    "small": TransformerConfig(vocab_size=256, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4,
                               d_ff=704),
    # Qwen2.5-0.5B: 24 layers, d=896, 14 heads / 2 KV heads, tied embeddings, qkv bias.
    "qwen2.5-0.5b": TransformerConfig(
        vocab_size=151936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2, d_ff=4864,
        rope_theta=1000000.0, norm_eps=1e-6, qkv_bias=True, tie_embeddings=True,
    ),
    # Llama-3.2-1B shapes (its RoPE frequency scaling is not modelled).
    "llama3.2-1b": TransformerConfig(
        vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, d_ff=8192,
        head_dim=64, rope_theta=500000.0, norm_eps=1e-5, qkv_bias=False, tie_embeddings=True,
    ),
}


def preset(name: str, **overrides) -> TransformerConfig:
  """A named preset, optionally with fields overridden."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; known: {', '.join(PRESETS)}.")
  return PRESETS[name].replace(**overrides)
