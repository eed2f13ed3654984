"""The lab's diagnostics against enumeration."""

import itertools

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit import models
from jaxcredit.lab import diagnostics
from jaxcredit.tasks import key_token


def _enumerated_success(model, config, symbols):
  """J by summing R(x, y) pi(y | x) over every allowed response y of every prompt, each
  response teacher-forced in full (filler hidden from the inputs as the sampler hides it)."""
  allowed = key_token.allowed(config)
  responses = np.array(list(itertools.product(*[np.flatnonzero(a) for a in allowed])))
  total = 0.0
  for keys in symbols:
    prompt = np.concatenate([[key_token.BOS], key_token.KEY0 + np.asarray(keys),
                             [key_token.SEP]])
    rows = np.concatenate([np.tile(prompt, (len(responses), 1)),
                           key_token.observe(responses, config)], axis=1)
    logits = model(jnp.asarray(rows), positions=jnp.broadcast_to(jnp.arange(rows.shape[1]),
                                                                 rows.shape),
                   token_valid=jnp.ones(rows.shape, bool)).logits.astype(jnp.float32)
    logits = logits[:, len(prompt) - 1:-1]  # the logits that pick each response token
    logp = jax.nn.log_softmax(jnp.where(allowed[None], logits, -jnp.inf), axis=-1)
    picked = jnp.take_along_axis(logp, jnp.asarray(responses)[..., None], axis=-1)[..., 0]
    reward = key_token.rule_reward(responses[:, config.decisive_positions],
                                   key_token.KEY0 + np.asarray(keys)[None], config)
    total = total + jnp.sum(jnp.asarray(reward, jnp.float32) * jnp.exp(picked.sum(-1)))
  return total / len(symbols)


@pytest.mark.parametrize("rule", ["all", "count"])
def test_success_gradient_equals_the_gradient_of_the_enumerated_success(rule):
  config = key_token.KeyTokenConfig(length=5, n_decisive=2, n_keys=2, n_fillers=2, rule=rule,
                                    filler_blind=True)
  model = models.Transformer(models.preset("tiny", vocab_size=key_token.VOCAB_SIZE),
                             rngs=nnx.Rngs(3))
  symbols = np.array(list(itertools.product(range(config.n_keys), repeat=config.n_decisive)))
  prompts, targets = key_token.traceable.prompts_of(symbols, config)
  j, grad = jax.jit(lambda m: diagnostics.success_gradient(m, config, prompts, targets))(model)
  want_j, want_grads = nnx.value_and_grad(
      lambda m: _enumerated_success(m, config, symbols))(model)
  want = jax.flatten_util.ravel_pytree(want_grads)[0]
  np.testing.assert_allclose(j, want_j, rtol=1e-5)
  assert np.linalg.norm(want) > 1e-3  # a gradient that can tell the two apart
  np.testing.assert_allclose(grad, want, rtol=1e-3, atol=1e-6 * np.abs(want).max())
