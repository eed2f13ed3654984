"""The transformer's per-layer building blocks: RMSNorm and rotary position embeddings
(Llama / Qwen2 conventions, computed in float32).

  y = RMSNorm(dim, eps=1e-6)(x)                    # x / rms(x) * weight
  q = rope(q, positions, theta, scaling)           # [B, T, H, D] rotated by position
"""

import jax
import jax.numpy as jnp
from flax import nnx
from jax import Array

from jaxcredit.models.config import RopeScaling


class RMSNorm(nnx.Module):
  """``y = x / sqrt(mean(x^2) + eps) * weight``, computed in float32.

  Args:
    dim: the normalised (last) dimension.
    eps: added to the mean square.
    param_dtype: the weight's dtype.
  """

  def __init__(self, dim: int, *, eps: float, param_dtype=jnp.float32):
    self.eps = eps
    self.weight = nnx.Param(jnp.ones((dim,), param_dtype))

  def __call__(self, x: Array) -> Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32**2, axis=-1, keepdims=True) + self.eps)
    return (normed * self.weight[...].astype(jnp.float32)).astype(x.dtype)


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> Array:
  """RoPE's angular frequencies ``f_i = theta^(-2i / head_dim)``, rescaled by Llama 3's rule
  when `scaling` is given (see `RopeScaling`).

  Args:
    head_dim: the head dimension D.
    theta: the RoPE base.
    scaling: Llama 3's frequency scaling, or None.

  Returns:
    float32 ``[head_dim / 2]``.
  """
  half = head_dim // 2
  inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  if scaling is None:
    return inv_freq
  context = scaling.original_max_position_embeddings
  wavelength = 2 * jnp.pi / inv_freq
  s = ((context / wavelength - scaling.low_freq_factor)
       / (scaling.high_freq_factor - scaling.low_freq_factor))
  smoothed = (1 - s) * inv_freq / scaling.factor + s * inv_freq
  return jnp.where(wavelength > context / scaling.low_freq_factor, inv_freq / scaling.factor,
                   jnp.where(wavelength < context / scaling.high_freq_factor, inv_freq, smoothed))


def rope(x: Array, positions: Array, theta: float, scaling: RopeScaling | None = None) -> Array:
  """Rotary embedding, half-split layout as in Llama and Qwen: rotates the pairs
  ``(x_i, x_{i + D/2})`` by the angle ``position * f_i``, f = `rope_frequencies`.

  Args:
    x: ``[B, T, H, D]``.
    positions: ``[B, T]`` int.
    theta: the RoPE base.
    scaling: Llama 3's frequency scaling, or None.

  Returns:
    ``[B, T, H, D]`` in x's dtype (computed in float32).

  References:
    Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
    arXiv 2104.09864.
  """
  inv_freq = rope_frequencies(x.shape[-1], theta, scaling)
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
  cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
