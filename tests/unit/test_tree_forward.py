"""The prefix-shared pass over a tree rollout equals the pass over its unrolled rows: log-probs,
entropies, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit import forward
from jaxcredit.models import Transformer, preset
from jaxcredit.rollout import Rollout
from jaxcredit.sampling import Actions, TreeSpec, sample_tree

CONFIG = preset("tiny", vocab_size=16)
SPEC = TreeSpec(roots=2, branching=2, depth=2, segment_tokens=3)
PROMPT, BUDGET = 4, 9


def _tree_rollout(model, actions):
  rng = np.random.default_rng(0)
  valid = np.arange(PROMPT)[None] >= rng.integers(0, 3, (2, 1))
  prompts = jnp.asarray(np.where(valid, rng.integers(6, 16, (2, PROMPT)), 0))
  tree = sample_tree(model, prompts, jnp.asarray(valid), jax.random.key(1), tree=SPEC,
                     max_new_tokens=BUDGET, stop_tokens=(5,), actions=actions)
  out = tree.output
  return Rollout(tokens=out.tokens, mask=out.mask, rewards=jnp.zeros(out.tokens.shape[0]),
                 positions=out.positions, token_valid=out.token_valid, group_size=SPEC.leaves)


@pytest.mark.parametrize("typed", [False, True])
def test_the_prefix_shared_pass_equals_the_unrolled_one(typed):
  model = Transformer(CONFIG.replace(value_head=True), rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)
  width = PROMPT + BUDGET
  actions = Actions()
  if typed:  # per-column allowed tokens and hidden columns, as key_token's
    allowed = rng.random((width, CONFIG.vocab_size)) < 0.5
    allowed[:, 9] = True
    actions = Actions(allowed, np.arange(width) % 3 == 1, 2)
  rollout = _tree_rollout(model, actions)
  weights = jnp.asarray(rng.normal(size=rollout.shape), jnp.float32)

  def loss(model, shared):
    tree = dict(tree=SPEC, prompt_length=PROMPT) if shared else {}
    outputs = forward.policy_outputs(model, rollout, 1.0, actions, **tree)
    scored = lambda x: jnp.sum(jnp.where(rollout.mask, x * weights, 0.0))
    return scored(outputs.logprobs) + scored(outputs.entropy) + scored(outputs.values), outputs

  value_and_grad = nnx.jit(nnx.value_and_grad(loss, has_aux=True), static_argnums=1)
  (value, shared), grads = value_and_grad(model, True)
  (want_value, unrolled), want_grads = value_and_grad(model, False)
  mask = np.asarray(rollout.mask)
  assert mask.sum() > 40
  for field in ("logprobs", "entropy", "values"):
    np.testing.assert_allclose(np.asarray(getattr(shared, field))[mask],
                               np.asarray(getattr(unrolled, field))[mask], atol=1e-5)
  np.testing.assert_allclose(value, want_value, atol=1e-5 * mask.sum())  # a sum of them
  flat, want_flat = jax.tree.leaves(grads), jax.tree.leaves(want_grads)
  scale = max(float(jnp.max(jnp.abs(g))) for g in want_flat)
  for g, w in zip(flat, want_flat):
    np.testing.assert_allclose(g, w, atol=1e-5 * scale)


def test_rows_that_are_not_whole_trees_are_refused():
  model = Transformer(CONFIG, rngs=nnx.Rngs(0))
  tokens = jnp.zeros((6, PROMPT + BUDGET), jnp.int32)
  with pytest.raises(ValueError, match="whole trees of 8 leaves"):
    forward.tree_forward(model, tokens, tokens > -1, tokens, SPEC, PROMPT)
  with pytest.raises(ValueError, match="whole trees of 8 leaves"):
    forward.tree_forward(model, tokens[:, :PROMPT + 6].repeat(4, 0)[:8], None, None, SPEC, PROMPT)
