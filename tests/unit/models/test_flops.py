"""Model FLOPs (models.flops) against XLA's own count of the compiled passes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models import Transformer, flops, preset

# Wide enough that norms, RoPE and softmax (which XLA counts and the model FLOPs leave out)
# are a few percent; layers unrolled and the whole score matrix computed, so XLA counts
# every product once.
CONFIG = preset("tiny", vocab_size=96, n_layers=2, d_model=128, n_heads=4, n_kv_heads=2,
                d_ff=384, attention="xla", scan_layers=False)


def _xla_flops(fn, *args) -> float:
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def _reference(config, length, causal, logits):
  """float64 sum over tokens and layers, written from the architecture's shapes."""
  d, h, kv, hd = config.d_model, config.n_heads, config.n_kv_heads, config.resolved_head_dim
  total = 0.0
  for i in range(length):
    keys = i + 1 if causal else length
    for _ in range(config.n_layers):
      total += 2.0 * (d * h * hd + 2 * d * kv * hd + h * hd * d)  # q, k, v, o
      total += 2.0 * 3 * d * config.d_ff  # gate, up, down
      total += 2.0 * 2 * h * hd * keys  # scores, weighted sum
    total += 2.0 * d * config.vocab_size if logits else 0.0
  return total


@pytest.mark.parametrize("length", [1, 7, 33])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("logits", [True, False])
def test_sequence_flops_are_the_sum_over_tokens_and_layers(length, causal, logits):
  for config in (CONFIG, preset("tiny", vocab_size=16, n_layers=1, d_model=32, n_heads=2,
                                n_kv_heads=1, d_ff=64, head_dim=8)):
    assert flops.sequence_flops(config, length, causal=causal, logits=logits) == _reference(
        config, length, causal, logits)


@pytest.mark.parametrize("length", [16, 48])
def test_a_forward_pass_is_what_xla_counts_within_the_elementwise_share(length):
  model = Transformer(CONFIG, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  tokens = jnp.zeros((2, length), jnp.int32)
  forward = lambda s, t: nnx.merge(graphdef, s)(t).logits
  counted = _xla_flops(forward, state, tokens)
  model_flops = 2 * flops.sequence_flops(CONFIG, length, causal=False)
  assert model_flops <= counted <= 1.03 * model_flops, (counted, model_flops)


def test_a_gradient_step_is_three_forward_passes_as_xla_counts_them():
  graphdef, state = nnx.split(Transformer(CONFIG, rngs=nnx.Rngs(0)))
  tokens = jnp.zeros((2, 32), jnp.int32)
  loss = lambda s, t: jnp.sum(nnx.merge(graphdef, s)(t).logits ** 2)
  forward = _xla_flops(loss, state, tokens)
  gradient = _xla_flops(jax.grad(loss), state, tokens)
  np.testing.assert_allclose(gradient / forward, 3.0, rtol=0.03)


def test_sampling_is_one_causal_pass_with_the_drawn_positions_logits():
  model_flops = flops.sampling_flops(CONFIG, 5, 9)
  assert model_flops == _reference(CONFIG, 14, True, False) + 9 * 2.0 * 128 * 96
  assert flops.sampling_flops(CONFIG, 5, 0) == flops.sequence_flops(CONFIG, 5, logits=False)


def test_a_token_attending_to_its_prefix_sums_to_the_sequence():
  for length in (1, 5, 12):
    assert sum(flops.token_flops(CONFIG, keys) for keys in range(1, length + 1)) == (
        flops.sequence_flops(CONFIG, length))
  # Traced keys (float: model FLOPs overflow int32): 4 FLOPs a key per layer, head and head dim.
  np.testing.assert_array_equal(
      jax.jit(lambda k: flops.token_flops(CONFIG, k, logits=False))(jnp.arange(1.0, 4.0)),
      [flops.sequence_flops(CONFIG, 1, logits=False) + 4 * 2 * 4 * 32 * k for k in (0, 1, 2)])
