"""Transformer configurations and presets (Llama 3 / Qwen2 / Qwen3 shapes)."""

import dataclasses

import jax
import jax.numpy as jnp

from jaxcredit.models.attention import IMPLEMENTATIONS

# TransformerConfig.remat -> the jax.checkpoint policy of each scanned block (None: no remat).
REMAT_POLICIES = {
    "none": None,
    "block": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3 RoPE frequency scaling (transformers' rope_type "llama3").

  With wavelength ``w_i = 2 pi / f_i`` of the base frequency f_i and L the original
  context: ``f_i / factor`` where ``w_i > L / low_freq_factor``, f_i where
  ``w_i < L / high_freq_factor``, and in between ``(1 - s) f_i / factor + s f_i`` with
  ``s = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``.

  Attributes:
    factor: the long-wavelength division.
    low_freq_factor: the long-wavelength threshold's divisor of L.
    high_freq_factor: the short-wavelength threshold's divisor of L.
    original_max_position_embeddings: L.
  """

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """A decoder-only transformer: RoPE, RMSNorm, SwiGLU, grouped-query attention.

  Attributes:
    vocab_size: V.
    d_model: D.
    n_layers: blocks.
    n_heads: query heads.
    n_kv_heads: key and value heads (n_heads % n_kv_heads == 0).
    d_ff: the SwiGLU hidden width.
    head_dim: per head; None for d_model // n_heads.
    rope_theta: the RoPE base.
    rope_scaling: Llama 3's frequency scaling, or None.
    norm_eps: RMSNorm's epsilon.
    qkv_bias: q/k/v projection biases (Qwen2: True, Llama / Qwen3: False).
    qk_norm: RMSNorm of each query and key head before RoPE (Qwen3).
    tie_embeddings: unembedding = embedding^T.
    value_head: also return V(s_t).
    dtype: the compute dtype (e.g. bfloat16).
    param_dtype: the stored weights' dtype.
    attention: "chunked" (blockwise, memory linear in length, any backend), "xla" (the
      whole score matrix), "cudnn" (cuDNN flash attention on GPUs) or "splash" (the Pallas
      splash kernel on TPUs for teacher-forced passes; decode steps and sequence-sharded
      passes then run "chunked"); see `models.attention`.
    attention_block: the attention's block size.
    remat: what the backward pass keeps of each block (`REMAT_POLICIES`: "none" keeps
      everything, "block" only its input and recomputes the rest; scanned layers only).
    scan_layers: run the stacked layers under `lax.scan` (True: compile time independent
      of depth) or as a Python loop over per-layer slices (False: XLA:CPU runs a shallow
      model's backward faster unrolled, without the scan's stacked activation buffers).
    max_position: the most slots a row may have (a checkpoint's max_position_embeddings,
      the positions its RoPE was trained for; None: unchecked); a longer row is refused
      with a ValueError.
  """

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  d_ff: int
  head_dim: int | None = None
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  norm_eps: float = 1e-6
  qkv_bias: bool = False
  qk_norm: bool = False
  tie_embeddings: bool = True
  value_head: bool = False
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  attention: str = "chunked"
  attention_block: int = 512
  remat: str = "none"
  scan_layers: bool = True
  max_position: int | None = None

  def __post_init__(self):
    if self.n_heads % self.n_kv_heads:
      raise ValueError(
          f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})."
      )
    if self.head_dim is None and self.d_model % self.n_heads:
      raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}).")
    if self.resolved_head_dim % 2:
      raise ValueError(f"RoPE needs an even head_dim, got {self.resolved_head_dim}.")
    if self.attention not in IMPLEMENTATIONS:
      raise ValueError(f"Unknown attention {self.attention!r}; known: "
                       f"{', '.join(IMPLEMENTATIONS)}.")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"Unknown remat {self.remat!r}; known: {', '.join(REMAT_POLICIES)}.")
    if not self.scan_layers and self.remat != "none":
      # Measured: unrolled, XLA:CPU schedules every recomputation early and
      # the compiled gradient keeps as much as without remat.
      raise ValueError(f"remat={self.remat!r} needs scan_layers=True (remat applies to "
                       "the scanned layers).")
    if not isinstance(self.attention_block, int) or self.attention_block < 1:
      raise ValueError(f"attention_block must be a positive int, got {self.attention_block!r}.")
    if self.max_position is not None and (not isinstance(self.max_position, int)
                                          or self.max_position < 1):
      raise ValueError(f"max_position must be a positive int or None, got {self.max_position!r}.")

  def check_length(self, slots: int) -> None:
    """ValueError when a row of `slots` slots is longer than max_position."""
    if self.max_position is not None and slots > self.max_position:
      raise ValueError(
          f"A row of {slots:,} tokens is longer than model.max_position = "
          f"{self.max_position:,} (the positions the checkpoint's RoPE was trained for): "
          "shorten the prompts and responses (task.max_prompt_length, max_response_length), "
          "or raise model.max_position where the model's RoPE scaling covers it.")

  def cache_slots(self, slots: int, headroom: int = 0) -> int:
    """The KV cache size to allocate for `slots` slots and up to `headroom` more.

    Past one attention block, a whole number of blocks, so that blockwise attention reads a
    decode step's key blocks from the cache in place instead of padding a copy of it; the
    headroom and the rounding never take it past max_position.

    Args:
      slots: the slots the cache must hold at least.
      headroom: slots more that it may hold.

    Returns:
      ``slots + headroom``, or the next multiple of ``attention_block``, at most max_position
      but at least ``slots``.

    Examples:
      >>> from jaxcredit.models import preset
      >>> preset("tiny", attention_block=512).cache_slots(600)
      1024
      >>> preset("tiny", attention_block=512, max_position=700).cache_slots(600, headroom=150)
      700
    """
    wanted = slots + headroom
    if wanted > self.attention_block:
      wanted = -(-wanted // self.attention_block) * self.attention_block
    return max(slots, min(wanted, self.max_position or wanted))

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim or self.d_model // self.n_heads

  def replace(self, **changes) -> "TransformerConfig":
    return dataclasses.replace(self, **changes)


LLAMA3_SCALING = RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=8192)

PRESETS = {
    # Runs in milliseconds on a laptop CPU; the quickstart and tests use it.
    "tiny": TransformerConfig(vocab_size=64, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2,
                              d_ff=256),
    "small": TransformerConfig(vocab_size=256, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4,
                               d_ff=704),
    # Qwen2.5-0.5B / 1.5B: tied embeddings, qkv bias.
    "qwen2.5-0.5b": TransformerConfig(
        vocab_size=151936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2, d_ff=4864,
        rope_theta=1000000.0, norm_eps=1e-6, qkv_bias=True, tie_embeddings=True,
        max_position=32768,
    ),
    "qwen2.5-1.5b": TransformerConfig(
        vocab_size=151936, d_model=1536, n_layers=28, n_heads=12, n_kv_heads=2, d_ff=8960,
        rope_theta=1000000.0, norm_eps=1e-6, qkv_bias=True, tie_embeddings=True,
        max_position=32768,
    ),
    # Qwen3-0.6B / 1.7B: q/k RMSNorm, head_dim 128, no qkv bias, tied embeddings.
    "qwen3-0.6b": TransformerConfig(
        vocab_size=151936, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8, d_ff=3072,
        head_dim=128, rope_theta=1000000.0, norm_eps=1e-6, qk_norm=True, tie_embeddings=True,
        max_position=40960,
    ),
    "qwen3-1.7b": TransformerConfig(
        vocab_size=151936, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8, d_ff=6144,
        head_dim=128, rope_theta=1000000.0, norm_eps=1e-6, qk_norm=True, tie_embeddings=True,
        max_position=40960,
    ),
    # Llama-3.2-1B / 3B: llama3 RoPE scaling (factor 32 over an 8192-token original context).
    "llama3.2-1b": TransformerConfig(
        vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, d_ff=8192,
        head_dim=64, rope_theta=500000.0, rope_scaling=LLAMA3_SCALING, norm_eps=1e-5,
        tie_embeddings=True, max_position=131072,
    ),
    "llama3.2-3b": TransformerConfig(
        vocab_size=128256, d_model=3072, n_layers=28, n_heads=24, n_kv_heads=8, d_ff=8192,
        head_dim=128, rope_theta=500000.0, rope_scaling=LLAMA3_SCALING, norm_eps=1e-5,
        tie_embeddings=True, max_position=131072,
    ),
}


def preset(name: str, **overrides) -> TransformerConfig:
  """A named preset configuration, optionally with fields overridden.

  Args:
    name: a key of `PRESETS` ("tiny", "small", "qwen2.5-0.5b", ...).
    **overrides: `TransformerConfig` fields to replace.

  Returns:
    a `TransformerConfig`.

  Raises:
    ValueError: on an unknown preset.

  Examples:
    >>> from jaxcredit.models import config
    >>> config.preset("tiny", n_layers=1).n_layers
    1
  """
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; known: {', '.join(PRESETS)}.")
  return PRESETS[name].replace(**overrides)
