"""Shared random inputs: ragged masks with interior holes and all-masked rows."""

import hypothesis
import numpy as np

hypothesis.settings.register_profile(
    "jaxcredit", max_examples=25, deadline=None, derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.load_profile("jaxcredit")

SHAPES = [(1, 1), (3, 7), (8, 16), (5, 33)]


def random_mask(rng: np.random.Generator, shape, *, holes: bool = True) -> np.ndarray:
  """Prompt prefix, ragged response end, interior holes, and (if B > 2) an all-masked row."""
  batch, length = shape
  mask = np.zeros(shape, bool)
  for b in range(batch):
    start = rng.integers(0, max(1, length // 3) + 1)
    end = rng.integers(start, length + 1)
    mask[b, start:end] = True
  if holes:
    mask &= rng.random(shape) > 0.15
  if batch > 2:
    mask[rng.integers(batch)] = False
  return mask


def poison(x: np.ndarray, mask: np.ndarray, value=np.nan) -> np.ndarray:
  """x with `value` written at every masked position."""
  return np.where(mask, x, value).astype(x.dtype)
