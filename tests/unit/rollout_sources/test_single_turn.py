"""SingleTurn's continuous engine: the same scored Rollout as the static batch drawing each
response with its own key."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxcredit.models import preset
from jaxcredit.rollout_sources import SingleTurn
from jaxcredit.sampling.continuous import response_keys
from tests.unit.sampling.conftest import left_padded_prompts, peaked_model


def test_the_continuous_engine_gives_the_static_batchs_rollout_with_per_response_keys():
  model = peaked_model(preset("tiny", vocab_size=16), 6)
  prompts, valid = left_padded_prompts(np.random.default_rng(0), 3, 5, 8, 16)
  batch = {"prompts": jnp.repeat(prompts, 4, 0), "prompt_valid": jnp.repeat(valid, 4, 0),
           "examples": [None] * 12}
  lengths = lambda tokens, mask, examples: mask.sum(1).astype(np.float32)  # a reward
  static = SingleTurn(lengths, 10, group_size=4, stop_tokens=(5, 7))
  continuous = SingleTurn(lengths, 10, group_size=4, stop_tokens=(5, 7), slots=3)
  got = continuous(model, batch, jax.random.key(1))
  want = static(model, batch, response_keys(jax.random.key(1), 12))
  for name in ("tokens", "mask", "rewards", "truncated", "positions", "token_valid"):
    np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
  for name in ("behaviour_logprobs", "entropy"):
    np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-4, atol=1e-5)
  assert got.group_size == 4 and len(set(np.asarray(got.rewards).tolist())) > 1
