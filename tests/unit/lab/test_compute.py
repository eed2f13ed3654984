"""The model FLOPs charged per update (lab.compute) against float64 loops over tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcredit.lab import compute
from jaxcredit.models import preset

CONFIG = preset("tiny", vocab_size=21, n_layers=2, d_model=48, n_heads=4, n_kv_heads=2,
                d_ff=80, head_dim=8)


def _token(config, keys, logits=True):
  """float64 forward FLOPs of one token attending to `keys`, from the shapes."""
  d, h, kv, hd = config.d_model, config.n_heads, config.n_kv_heads, config.resolved_head_dim
  per_layer = 2.0 * (d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * config.d_ff)
  per_layer += 4.0 * h * hd * keys
  return config.n_layers * per_layer + (2.0 * d * config.vocab_size if logits else 0.0)


def _forward(config, prompt_length, shares, prompts, logits=True):
  total = prompts * sum(_token(config, i + 1, logits=False) for i in range(prompt_length))
  for b in range(shares.shape[0]):
    for t in range(shares.shape[1]):
      total += shares[b, t] * _token(config, prompt_length + t + 1, logits)
  return total


def _continuations(config, prompt_length, mask, k):
  total = 0.0
  for b, t in zip(*np.nonzero(mask)):
    total += k * sum(_token(config, prompt_length + j + 1) for j in range(t, mask.shape[1]))
  return total


@pytest.mark.parametrize("prompt_length,shape", [(1, (1, 1)), (3, (4, 5)), (7, (6, 9))])
def test_forward_and_continuation_flops_match_float64_loops(prompt_length, shape):
  rng = np.random.default_rng(sum(shape))
  mask = rng.random(shape) < 0.7
  shares = mask * rng.choice([1.0, 0.5, 0.25], size=shape)  # a tree's shared segments
  for logits in (True, False):
    np.testing.assert_allclose(
        compute.forward_flops(CONFIG, prompt_length, jnp.asarray(shares), 3, logits=logits),
        _forward(CONFIG, prompt_length, shares, 3, logits), rtol=1e-6)
  np.testing.assert_allclose(compute.continuation_flops(CONFIG, prompt_length, mask, 4),
                             _continuations(CONFIG, prompt_length, mask, 4), rtol=1e-6)


def test_an_arm_is_charged_the_parts_it_reads_under_jit():
  rng = np.random.default_rng(0)
  mask = rng.random((6, 7)) < 0.8
  shares = jnp.asarray(mask, jnp.float32)
  charge = jax.jit(lambda k, critic, prime: compute.update_flops(
      CONFIG, 5, shares, 6, continued=mask, k=k, critic=critic, prime=prime))
  policy, trunk = _forward(CONFIG, 5, mask, 6), _forward(CONFIG, 5, mask, 6, logits=False)
  continuations = _continuations(CONFIG, 5, mask, 3)
  cases = {(0, False, False): 4 * policy,  # sampling and the learner's step
           (0, True, False): 4 * policy + 4 * trunk,  # the critic's values and its step
           (0, False, True): 8 * policy,  # the PRM's step and the reference's log-probs
           (3, False, False): 4 * policy + continuations}
  for (k, critic, prime), want in cases.items():
    np.testing.assert_allclose(charge(k, critic, prime), want, rtol=1e-6)
