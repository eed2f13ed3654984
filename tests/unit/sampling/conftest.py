"""Policies with peaked conditionals (stop tokens occur) and left-padded prompts."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcredit.models import Transformer


def peaked_model(config, scale: float) -> Transformer:
  """A `Transformer` whose parameters are the init's times `scale` plus small noise: peaked
  distributions, so that stop tokens occur and some entropies are low."""
  model = Transformer(config, rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  rng = np.random.default_rng(0)
  nnx.update(model, jax.tree.map(
      lambda x: x * scale + 0.02 * rng.normal(size=x.shape).astype(x.dtype), state))
  return model


def left_padded_prompts(rng: np.random.Generator, batch: int, length: int, low: int, high: int):
  """``[batch, length]`` prompts of ids in [low, high), each at least 2 tokens long, and their
  validity, left-padded with 0."""
  lengths = rng.integers(2, length + 1, batch)
  valid = np.arange(length)[None] >= (length - lengths)[:, None]
  tokens = np.where(valid, rng.integers(low, high, (batch, length)), 0)
  return jnp.asarray(tokens), jnp.asarray(valid)
