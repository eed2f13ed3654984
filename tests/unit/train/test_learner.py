"""The learner step: one jitted pure function over (state, rollout)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxcredit import estimators, forward, losses
from jaxcredit.models import Transformer, preset
from jaxcredit.rollout import Rollout
from jaxcredit.train import learner

LEARNING_RATE = 0.5
OBJECTIVE = {"policy": {"name": "ppo_clip"}}


def _modules():
  model = Transformer(preset("tiny", vocab_size=32), rngs=nnx.Rngs(0))
  return {
    "model": model,
    "optimizer": nnx.Optimizer(model, optax.sgd(LEARNING_RATE), wrt=nnx.Param),
    "reference": nnx.clone(model),
  }


def _rollout(model) -> Rollout:
  """Two groups of two: rewards (1, 0) and (1, 1); 3 prompt columns, ragged responses."""
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(1, 32, (4, 8)), jnp.int32)
  mask = np.zeros((4, 8), bool)
  for row, end in enumerate((8, 6, 7, 5)):
    mask[row, 3:end] = True
  rollout = Rollout(
    tokens=tokens,
    mask=jnp.asarray(mask),
    rewards=jnp.asarray([1.0, 0.0, 1.0, 1.0]),
    group_size=2,
    positions=jnp.tile(jnp.arange(8), (4, 1)),
    token_valid=jnp.ones((4, 8), bool),
  )
  behaviour = forward.policy_outputs(model, rollout, 1.0)  # on-policy: every ratio starts at 1
  return rollout.replace(behaviour_logprobs=behaviour.logprobs, entropy=behaviour.entropy)


def test_two_minibatches_equal_two_sequential_updates_and_average_their_metrics():
  modules = _modules()
  rollout = _rollout(modules["model"])
  graphdef, state = nnx.split(modules)
  step = learner.make_step(
    graphdef,
    advantage=estimators.from_config("grpo"),
    objective=losses.from_config(OBJECTIVE),
    settings=learner.Settings(minibatches=2),
  )
  orders = learner.minibatch_orders(4, 2, 1, 2, 0, 3)
  new_state, metrics = step(state, rollout, orders, 3)

  # By hand: GRPO gives (0.5 / std(1, 0), -0.5 / std(1, 0)) = (1/sqrt 2, -1/sqrt 2) and (0, 0);
  # at ratio 1
  # PPO-clip's token-mean loss on a minibatch is -sum(A * m) / sum(m).
  advantages = np.array([2**-0.5, -(2**-0.5), 0.0, 0.0])
  lengths = np.asarray(rollout.mask).sum(1)
  first = orders[0]
  np.testing.assert_allclose(
    -(advantages[first] * lengths[first]).sum() / lengths[first].sum(),
    _first_loss(modules, rollout, first),
    rtol=1e-5,
    atol=1e-6,
  )

  # The same two updates, one after the other, with plain SGD.
  model = nnx.clone(modules["model"])
  scored = rollout.replace(
    ref_logprobs=forward.policy_outputs(modules["reference"], rollout, 1.0).logprobs
  )
  estimate = estimators.from_config("grpo")(scored)
  objective = losses.from_config(OBJECTIVE)
  seen = []
  value_and_grad = nnx.jit(
    lambda model, mini, mini_estimate: nnx.value_and_grad(
      lambda m: objective(forward.policy_outputs(m, mini, 1.0), mini, mini_estimate, 3),
      has_aux=True,
    )(model)
  )
  for rows in orders:
    mini, mini_estimate = jax.tree.map(lambda x: x[rows], (scored, estimate))
    (loss, _), grads = value_and_grad(model, mini, mini_estimate)
    params = nnx.state(model, nnx.Param)
    nnx.update(
      model, jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, nnx.state(grads, nnx.Param))
    )
    seen.append((float(loss), float(optax.tree.norm(grads))))
  assert seen[0][0] != seen[1][0]
  nnx.update(modules, new_state)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
    nnx.state(modules["model"], nnx.Param),
    nnx.state(model, nnx.Param),
  )
  np.testing.assert_allclose(metrics["loss"], np.mean([s[0] for s in seen]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["grad_norm"], np.mean([s[1] for s in seen]), rtol=1e-5)
  np.testing.assert_allclose(metrics["reward_mean"], 0.75)
  np.testing.assert_allclose(
    metrics["kl"], 0.0, atol=1e-6
  )  # the reference is the sampling policy here


def _first_loss(modules, rollout, rows) -> float:
  """The learner's loss on the minibatch `rows` alone (one minibatch of that batch)."""
  rows_rollout = jax.tree.map(lambda x: x[rows], rollout)
  graphdef, state = nnx.split(modules)
  step = learner.make_step(
    graphdef,
    advantage=estimators.from_config("grpo"),
    objective=losses.from_config(OBJECTIVE),
    settings=learner.Settings(),
  )
  return float(step(state, rows_rollout, None, 3)[1]["loss"])


def test_epochs_repeat_the_whole_batch_and_a_present_reference_is_kept():
  modules = _modules()
  rollout = _rollout(modules["model"])
  graphdef, state = nnx.split(modules)
  step = learner.make_step(
    graphdef,
    advantage=estimators.from_config("grpo"),
    objective=losses.from_config({"kl": {"name": "kl", "kind": "k1"}}),
    settings=learner.Settings(epochs=3),
  )
  # A given reference is used as is: k1 KL to a reference 0.25 below the policy is 0.25 at the
  # first update.
  shifted = rollout.replace(ref_logprobs=rollout.behaviour_logprobs - 0.25)
  _, metrics = step(state, shifted, None, 0)
  assert (
    float(metrics["kl/value"]) < 0.25
  )  # averaged over 3 updates that each lower the policy's log-probs
  _, once = learner.make_step(
    graphdef,
    advantage=estimators.from_config("grpo"),
    objective=losses.from_config({"kl": {"name": "kl", "kind": "k1"}}),
    settings=learner.Settings(epochs=1),
  )(state, shifted, None, 0)
  np.testing.assert_allclose(once["kl/value"], 0.25, rtol=1e-5)


def test_critic_values_are_computed_once_and_present_ones_are_kept():
  """prepare runs the critic on a batch without values; values already set (the batched
  lab runs its critic before the step) are used as they are, not recomputed."""
  modules = _modules()
  critic = Transformer(preset("tiny", vocab_size=32, value_head=True), rngs=nnx.Rngs(1))
  rollout = _rollout(modules["model"])
  settings = learner.Settings(critic=learner.CriticSettings())
  computed = learner.prepare({**modules, "critic": critic}, rollout, settings).values
  np.testing.assert_allclose(computed, forward.critic_values(critic, rollout), atol=1e-6)
  given = jnp.full(rollout.mask.shape, 0.5)
  kept = learner.prepare({**modules, "critic": None}, rollout.replace(values=given), settings)
  np.testing.assert_array_equal(kept.values, given)


def test_recomputed_old_logprobs_feed_off_policy_losses_and_the_mismatch_metrics():
  """The sampler's log-probs off by a known gap: the learner recomputes the policy's own
  (the proximal policy), tis reads both, and mismatch/... measures the gap exactly."""
  modules = _modules()
  rollout = _rollout(modules["model"])
  mask = np.asarray(rollout.mask)
  gap = np.where(mask, np.random.default_rng(1).normal(0.0, 0.1, mask.shape), 0.0)
  sampled = rollout.replace(
    behaviour_logprobs=rollout.behaviour_logprobs + jnp.asarray(gap, jnp.float32)
  )
  graphdef, state = nnx.split(modules)
  make = lambda recompute: learner.make_step(
    graphdef,
    advantage=estimators.from_config("grpo"),
    objective=losses.from_config({"policy": {"name": "tis", "cap": 2.0}}),
    settings=learner.Settings(recompute_old_logprobs=recompute),
  )
  _, metrics = make(True)(state, sampled, None, 0)
  np.testing.assert_allclose(metrics["mismatch/abs_logp_diff"], np.abs(gap[mask]).mean(), rtol=1e-4)
  np.testing.assert_allclose(metrics["mismatch/k3"], (np.expm1(-gap) + gap)[mask].mean(), rtol=1e-3)
  np.testing.assert_allclose(metrics["mismatch/max_ratio"], np.exp(-gap[mask]).max(), rtol=1e-5)
  w = np.minimum(np.exp(-gap), 2.0)  # pi_old / mu, truncated
  np.testing.assert_allclose(metrics["policy/is_weight_mean"], w[mask].mean(), rtol=1e-5)
  try:
    make(False)(state, sampled, None, 0)
  except ValueError as error:
    assert "tis needs rollout.old_logprobs" in str(error) and "recompute_old_logprobs" in str(error)
  else:
    raise AssertionError("tis ran without old_logprobs")
