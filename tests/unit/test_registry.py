"""Rollout, the registries and their adapters; the rollouts guide's registration example."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcredit as jc
from jaxcredit import estimators, losses, testing
from jaxcredit.testing import strategies
from tests import reference
from tests.conftest import poison, random_mask, doc_block


def make_rollout(batch=8, length=10, group_size=4, seed=0, poisoned=True) -> jc.Rollout:
  """A rollout with every optional field; NaN at masked positions when poisoned."""
  rng = np.random.default_rng(seed)
  mask = random_mask(rng, (batch, length))
  fill = (lambda x: poison(x, mask)) if poisoned else (lambda x: x)
  token = lambda: fill(rng.normal(size=(batch, length)).astype(np.float32))
  logprobs = fill(-rng.exponential(1.0, size=(batch, length)).astype(np.float32))
  sum_pi_squared = fill(
    np.exp(logprobs) ** 2 + 0.1 * rng.random((batch, length)).astype(np.float32)
  )
  return jc.Rollout(
    tokens=jnp.asarray(rng.integers(0, 32, (batch, length))),
    mask=jnp.asarray(mask),
    rewards=jnp.asarray(rng.integers(0, 2, batch).astype(np.float32)),
    behaviour_logprobs=jnp.asarray(logprobs),
    old_logprobs=jnp.asarray(
      logprobs + fill(0.05 * rng.normal(size=(batch, length)).astype(np.float32))
    ),
    staleness=jnp.asarray(rng.integers(0, 4, batch)),
    ref_logprobs=jnp.asarray(
      logprobs + fill(0.1 * rng.normal(size=(batch, length)).astype(np.float32))
    ),
    values=jnp.asarray(token()),
    token_rewards=jnp.asarray(0.1 * token()),
    entropy=jnp.asarray(fill(rng.exponential(1.0, size=(batch, length)).astype(np.float32))),
    turn_ids=jnp.asarray(testing.strategies.make_turn_ids(rng, batch, length)),
    extras={
      "baseline_rewards": jnp.asarray(rng.integers(0, 2, batch).astype(np.float32)),
      "sum_pi_squared": jnp.asarray(sum_pi_squared),
      "target_logprobs": jnp.asarray(logprobs + fill(0.2 * token())),
      "mc_values": jnp.asarray(token()),
      "mc_evaluated": jnp.asarray(rng.random((batch, length)) < 0.5),
      "oracle_advantages": jnp.asarray(token()),
      "oracle_values": jnp.asarray(token()),
      "shuffle_priorities": jnp.asarray(rng.random((batch, length)), jnp.float32),
      "ktae_scores": jnp.asarray(token()),
      "turn_rewards": jnp.asarray(token()),
      "turn_anchors": jnp.asarray(rng.integers(0, 3, (batch, length))),
      "turn_baselines": jnp.asarray(token()),
      "reward_components": jnp.asarray(rng.normal(size=(batch, 3)), jnp.float32),
      "role_baselines": jnp.asarray(rng.random(batch), jnp.float32),
      **dict(zip(("tree_path", "tree_segments"), map(jnp.asarray, strategies.random_tree(
          rng, batch, length, group_size, 2)))),
      "length_weights": jnp.asarray(rng.uniform(0.5, 1.5, batch), jnp.float32),
    },
    group_size=group_size,
  )


@pytest.mark.parametrize("name", estimators.names())
def test_every_estimator_is_finite_masked_and_jit_consistent(name):
  rollout = make_rollout()
  estimate = estimators.get(name)(rollout)
  jitted = jax.jit(estimators.get(name))(rollout)
  chex.assert_trees_all_close(estimate, jitted, atol=1e-6)
  mask = np.asarray(rollout.mask)
  for array in (estimate.advantages, estimate.returns):
    if array is not None:
      chex.assert_shape(array, rollout.shape)
      assert array.dtype == jnp.float32
      assert np.all(np.isfinite(array))
      np.testing.assert_array_equal(np.asarray(array)[~mask], 0.0)


def test_adapters_match_their_functions():
  rollout = make_rollout(poisoned=False)
  mask = np.asarray(rollout.mask)
  grpo = estimators.get("grpo")(rollout).advantages
  want = np.where(mask, reference.grpo(rollout.rewards, 4)[:, None], 0.0)
  np.testing.assert_allclose(grpo, want, atol=1e-5)
  token_rewards = np.asarray(rollout.token_rewards, np.float64) * mask
  for b in range(mask.shape[0]):
    if mask[b].any():
      token_rewards[b, np.flatnonzero(mask[b])[-1]] += float(rollout.rewards[b])
  adv, ret = estimators.get("gae")(rollout, gamma=0.9, lam=0.8)
  want_adv, want_ret = reference.gae(token_rewards, rollout.values, mask, 0.9, 0.8)
  np.testing.assert_allclose(adv, want_adv, atol=1e-5)
  np.testing.assert_allclose(ret, want_ret, atol=1e-5)
  reinforce = estimators.get("reinforce")(rollout, gamma=0.5).advantages
  np.testing.assert_allclose(
    reinforce, reference.discounted_returns(token_rewards, mask, 0.5), atol=1e-5
  )


@pytest.mark.parametrize("name", losses.names())
def test_every_loss_is_finite_with_finite_gradient(name):
  rollout = make_rollout(group_size=2)
  estimate = estimators.get("gae")(rollout)
  nan_outside = lambda x: jnp.where(rollout.mask, x, jnp.nan)
  outputs = jc.PolicyOutputs(
    logprobs=nan_outside(rollout.behaviour_logprobs + 0.1),
    entropy=nan_outside(rollout.entropy * 0.9),
    values=nan_outside(rollout.values + 0.1),
  )

  def loss(outputs):
    return losses.get(name)(outputs, rollout, estimate)

  (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(outputs)
  jitted_value, _ = jax.jit(loss)(outputs)
  np.testing.assert_allclose(value, jitted_value, rtol=1e-6, atol=1e-6)
  assert value.shape == () and np.isfinite(value)
  assert metrics and all(np.isfinite(v) and np.shape(v) == () for v in metrics.values())
  for grad in grads:
    assert np.all(np.isfinite(grad))
    np.testing.assert_array_equal(np.asarray(grad)[~np.asarray(rollout.mask)], 0.0)


def test_loss_adapters_match_their_functions():
  rollout = make_rollout(group_size=2, poisoned=False)
  estimate = estimators.get("rloo")(rollout)
  outputs = jc.PolicyOutputs(logprobs=rollout.behaviour_logprobs + 0.05)
  for anchor in (rollout, rollout.replace(old_logprobs=None)):  # proximal, else behaviour
    got, _ = losses.get("ppo_clip")(outputs, anchor, estimate, clip_high=0.28)
    want, _ = losses.ppo_clip_loss(
      outputs.logprobs,
      anchor.proximal_logprobs(by="test"),
      estimate.advantages,
      rollout.mask,
      clip_high=0.28,
    )
    np.testing.assert_allclose(got, want)
  assert rollout.proximal_logprobs(by="test") is rollout.old_logprobs
  seq = losses.sequence_advantages(estimate.advantages, rollout.mask)
  has_tokens = np.asarray(rollout.mask).any(1)
  np.testing.assert_allclose(
    np.asarray(seq)[has_tokens], reference.rloo(rollout.rewards, 2)[has_tokens], atol=1e-5
  )
  mask = np.asarray(rollout.mask)
  policy = np.where(mask, np.asarray(outputs.logprobs, np.float64), 0).sum(1)
  ref = np.where(mask, np.asarray(rollout.ref_logprobs, np.float64), 0).sum(1)
  dpo, _ = losses.get("dpo")(outputs, rollout, estimate, beta=0.5)
  np.testing.assert_allclose(
    dpo, reference.dpo(policy[0::2], policy[1::2], ref[0::2], ref[1::2], 0.5), atol=1e-5
  )


def test_unknown_names_list_known_ones():
  with pytest.raises(
    ValueError, match="Unknown estimator 'gpro'; known: dr_grpo, gae, gdpo, gigpo, gpg, grpo, "
  ):
    estimators.get("gpro")
  with pytest.raises(
    ValueError,
    match="Unknown loss 'ppo'; known: cispo, clip_cov, decoupled_ppo, dpo, dppo, entropy, ",
  ):
    losses.get("ppo")


def test_register_rejects_duplicates_and_overwrites_on_request():
  with pytest.raises(ValueError, match="'grpo' is already registered"):
    estimators.register("grpo")(lambda rollout: rollout.mask)
  estimators.register("all_ones")(lambda rollout: jnp.where(rollout.mask, 1.0, 0.0))
  estimators.register("all_ones", overwrite=True)(lambda rollout: jnp.where(rollout.mask, 2.0, 0.0))
  try:
    rollout = make_rollout()
    got = estimators.get("all_ones")(rollout)
    assert isinstance(got, jc.Estimate) and got.returns is None
    np.testing.assert_array_equal(got.advantages, np.where(rollout.mask, 2.0, 0.0))
  finally:
    estimators.REGISTRY.unregister("all_ones")
  assert "all_ones" not in estimators.REGISTRY


def test_rollout_validation_names_the_problem():
  rollout = make_rollout()
  with pytest.raises(ValueError, match="Batch size 8 is not divisible by group_size 3"):
    estimators.get("grpo")(rollout.replace(group_size=3))
  with pytest.raises(ValueError, match=r"values\[8, 9\]"):
    estimators.get("gae")(rollout.replace(values=rollout.values[:, :9]))
  with pytest.raises(ValueError, match=r"rewards must have shape \[B\]=\[8\]"):
    estimators.get("grpo")(rollout.replace(rewards=rollout.rewards[:4]))
  with pytest.raises(ValueError, match=r"gae needs rollout.values"):
    estimators.get("gae")(rollout.replace(values=None))
  with pytest.raises(ValueError, match=r"dpo needs pairs: group_size must be 2"):
    losses.get("dpo")(
      jc.PolicyOutputs(rollout.behaviour_logprobs), rollout, estimators.get("grpo")(rollout)
    )
  with pytest.raises(ValueError, match=r"outputs.logprobs\[8, 9\]"):
    losses.get("ppo_clip")(
      jc.PolicyOutputs(rollout.behaviour_logprobs[:, :9]), rollout, estimators.get("grpo")(rollout)
    )


def test_rollout_is_a_pytree_with_static_group_size():
  rollout = make_rollout()
  leaves, treedef = jax.tree.flatten(rollout)
  assert len(leaves) == 11 + len(rollout.extras)  # 11 array fields + the extras
  assert jax.tree.unflatten(treedef, leaves).group_size == 4
  doubled = jax.tree.map(lambda x: x * 2, rollout.replace(token_rewards=None))
  assert doubled.token_rewards is None and doubled.group_size == 4


def test_readme_examples_run():
  rollout = make_rollout()
  namespace = {"rollout": rollout, "new_logp": rollout.behaviour_logprobs}
  exec(doc_block("jc.losses.get(\"ppo_clip\")"), namespace)
  assert np.isfinite(namespace["loss"])
  try:
    exec(doc_block("@jc.estimators.register(\"max_baseline\")"), namespace)
    grouped = np.asarray(rollout.rewards).reshape(-1, 4)
    want = (grouped - grouped.max(1, keepdims=True)).reshape(-1)
    np.testing.assert_allclose(
      namespace["estimate"].advantages, np.where(rollout.mask, want[:, None], 0.0)
    )
  finally:
    estimators.REGISTRY.unregister("max_baseline")
