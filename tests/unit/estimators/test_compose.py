"""Composable advantages and objectives: config-built == hand-written NumPy sums."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcredit as jc
from jaxcredit import estimators, losses, testing
from tests import reference
from tests.conftest import load_experiment


def _rollout(seed=0, group_size=4):
  return testing.strategies.make_rollout(
      np.random.default_rng(seed), batch=8, length=9, group_size=group_size)


def test_weighted_sum_masked_and_reweighted_match_numpy():
  rollout = _rollout()
  mask = np.asarray(rollout.mask)
  grpo = np.where(mask, reference.grpo(rollout.rewards, 4)[:, None], 0.0)
  rloo = np.where(mask, reference.rloo(rollout.rewards, 4)[:, None], 0.0)
  mixed = jax.jit(estimators.weighted_sum((0.25, "grpo"), (0.75, estimators.component("rloo"))))
  np.testing.assert_allclose(mixed(rollout).advantages, 0.25 * grpo + 0.75 * rloo, atol=1e-5)
  entropy = np.where(mask, np.asarray(rollout.entropy), -np.inf)
  n_keep = int(np.ceil(0.3 * mask.sum()))
  keep = mask & (entropy >= np.sort(entropy[mask])[::-1][n_keep - 1])
  focused = jax.jit(estimators.masked("grpo", estimators.high_entropy_tokens(rho=0.3)))
  np.testing.assert_allclose(focused(rollout).advantages, np.where(keep, grpo, 0.0), atol=1e-5)
  control = jax.jit(estimators.from_config({"mask": "low_entropy", "rho": 0.3, "of": "grpo"}))
  np.testing.assert_allclose(control(rollout).advantages, np.where(mask & ~keep, grpo, 0.0),
                             atol=1e-5)
  surprisal = -np.asarray(rollout.behaviour_logprobs, np.float64)
  weights = np.where(mask, surprisal / surprisal[mask].mean(), 0.0)
  weighted = jax.jit(estimators.reweighted("grpo", estimators.surprisal))
  np.testing.assert_allclose(weighted(rollout).advantages, grpo * weights, atol=1e-5)


@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_groups_with_success_drops_exactly_the_groups_where_every_response_failed(group_size):
  rng = np.random.default_rng(group_size)
  rollout = _rollout(seed=group_size, group_size=group_size)
  rewards = (rng.random(8) < 0.3).astype(np.float32)
  rewards[:group_size] = 0.0  # an all-failed group
  rewards[-1] = 1.0  # and one that succeeded
  rollout = rollout.replace(rewards=jnp.asarray(rewards))
  baseline = lambda r: jc.Estimate(advantages=jnp.where(r.mask, r.rewards[:, None] - 0.5, 0.0))
  kept = jax.jit(estimators.masked(baseline, estimators.groups_with_success()))(rollout)
  mask = np.asarray(rollout.mask)
  expected = np.zeros(mask.shape)
  for start in range(0, 8, group_size):
    rows = slice(start, start + group_size)
    if (rewards[rows] > 0).any():
      expected[rows] = np.where(mask[rows], rewards[rows, None].astype(np.float64) - 0.5, 0.0)
  np.testing.assert_allclose(kept.advantages, expected, atol=1e-6)
  # A group baseline gives an all-failed 0/1 group nothing: masking it changes nothing.
  config = {"mask": "groups_with_success", "of": "grpo"}
  np.testing.assert_allclose(estimators.from_config(config)(rollout).advantages,
                             estimators.get("grpo")(rollout).advantages, atol=1e-6)
  # The threshold: with rewards of 0.25 no group succeeds above 0.5.
  quarter = rollout.replace(rewards=jnp.full(8, 0.25))
  assert not estimators.groups_with_success(threshold=0.5)(quarter).any()
  stacked = jax.tree.map(lambda *x: jnp.stack(x), rollout, quarter)
  selected = jax.vmap(estimators.groups_with_success(threshold=0.2))(stacked)
  np.testing.assert_array_equal(selected[1], mask)


def test_weighted_sum_of_returns():
  rollout = _rollout(1)
  a, b = estimators.get("gae")(rollout), estimators.get("reinforce")(rollout)
  mixed = estimators.weighted_sum((2.0, "gae"), (-1.0, "reinforce"))(rollout)
  np.testing.assert_allclose(mixed.returns, 2 * a.returns - b.returns, atol=1e-5)
  assert estimators.weighted_sum((1.0, "gae"), (1.0, "grpo"))(rollout).returns is None


def test_shipped_experiment_advantage_matches_hand_written():
  config = load_experiment("credit_mix")
  rollout = _rollout(2)
  got = jax.jit(estimators.from_config(config.advantage))(rollout).advantages
  mask = np.asarray(rollout.mask)
  grpo = np.where(mask, reference.grpo(rollout.rewards, 4)[:, None], 0.0)
  prime = np.asarray(estimators.get("prime")(rollout, beta=0.05).advantages)
  keep = np.asarray(estimators.high_entropy_mask(rollout.entropy, rollout.mask, rho=0.2))
  np.testing.assert_allclose(got, np.where(keep, 0.7 * grpo + 0.3 * prime, 0.0), atol=1e-5)


@pytest.mark.parametrize("step", [0, 500, 2000])
def test_shipped_experiment_objective_matches_numpy(step):
  config = load_experiment("credit_mix")
  rollout = _rollout(3)
  estimate = estimators.get("grpo")(rollout)
  logp = rollout.behaviour_logprobs + 0.1 * jnp.sin(jnp.arange(9.0))
  outputs = jc.PolicyOutputs(logprobs=logp, entropy=rollout.entropy)
  objective = jax.jit(losses.from_config(config.objective))
  loss, metrics = objective(outputs, rollout, estimate, step)
  mask = np.asarray(rollout.mask)
  policy = reference.aggregate(reference.ppo_clip_tokens(
      logp, rollout.old_logprobs, estimate.advantages, 0.2, 0.28), mask, "token-mean")
  kl = reference.aggregate(reference.kl(logp, rollout.ref_logprobs, "k3"), mask, "token-mean")
  entropy_coef = 1e-3 * max(0.0, 1 - step / 1000)
  entropy = -np.asarray(rollout.entropy, np.float64)[mask].mean()
  kl_coef = config.objective["kl"]["coef"]
  np.testing.assert_allclose(
    loss, policy + kl_coef * kl + entropy_coef * entropy, rtol=1e-5, atol=1e-7
  )
  np.testing.assert_allclose(metrics["kl/value"], kl, rtol=1e-5)
  np.testing.assert_allclose(metrics["entropy/coef"], entropy_coef, rtol=1e-5, atol=1e-9)
  assert {"loss", "policy/clipfrac", "policy/value", "kl/coef"} <= set(metrics)
  grads = jax.grad(lambda o: objective(o, rollout, estimate, step)[0])(outputs)
  assert all(np.all(np.isfinite(g)) for g in grads if g is not None)


def test_factories_match_config():
  rollout = _rollout(4)
  estimate = estimators.get("rloo")(rollout)
  outputs = jc.PolicyOutputs(logprobs=rollout.behaviour_logprobs - 0.05, entropy=rollout.entropy)
  by_hand = losses.combine(
    policy=losses.ppo_clip(clip_high=0.28),
    kl=losses.kl_term(coef=0.1, kind="k3"),
    entropy=losses.entropy_term(coef=optax.linear_schedule(1e-3, 0.0, 1000)),
  )
  by_config = losses.from_config(load_experiment("credit_mix").objective)
  np.testing.assert_allclose(
    by_hand(outputs, rollout, estimate, 10)[0],
    by_config(outputs, rollout, estimate, 10)[0],
    rtol=1e-6,
  )


def test_bad_configs_raise():
  with pytest.raises(ValueError, match="needs one of 'name', 'sum', 'mask', 'reweight'"):
    estimators.from_config({"weight": 1.0})
  with pytest.raises(ValueError, match="Unknown token selector 'top_entropy'"):
    estimators.from_config({"mask": "top_entropy", "of": "grpo"})
  with pytest.raises(ValueError, match="Unknown estimator 'grop'"):
    estimators.from_config({"name": "grop"})
  with pytest.raises(ValueError, match="needs a 'name'"):
    losses.from_config({"policy": {"coef": 1.0}})
  with pytest.raises(ValueError, match="optax \\*_schedule"):
    losses.from_config({"policy": {"name": "pg", "coef": {"schedule": "adam"}}})


def test_rms_scaled_credit_has_unit_rms_and_keeps_zero_credit():
  rollout = _rollout(3)
  mask = np.asarray(rollout.mask)
  grpo = np.where(mask, reference.grpo(rollout.rewards, 4)[:, None], 0.0)
  scaled = jax.jit(estimators.from_config({"scale": "rms", "of": "grpo"}))(rollout).advantages
  np.testing.assert_allclose(scaled, grpo / np.sqrt(np.mean(grpo[mask] ** 2)), atol=1e-5)
  flat = rollout.replace(rewards=jnp.zeros_like(rollout.rewards))
  np.testing.assert_array_equal(estimators.rms_scaled("grpo")(flat).advantages, 0.0)
  with pytest.raises(ValueError, match="scale takes 'rms'"):
    estimators.from_config({"scale": "max", "of": "grpo"})
