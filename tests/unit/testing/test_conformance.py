"""The conformance kit on every built-in, and on deliberately broken examples."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

import jaxcredit as jc
from jaxcredit import estimators, losses, testing
from jaxcredit._masking import as_bool
from tests.conftest import doc_block

SHIFT_INVARIANT = {
    "grpo", "dr_grpo", "rloo", "gpg", "opo", "reinforce_pp_baseline", "grpo_high_entropy",
    "grpo_surprisal", "prime", "spo_tree", "treerl", "tempo", "treepo", "tree_grpo",
}
SCALE_INVARIANT = {
  "grpo",
  "grpo_batch_std",
  "grpo_high_entropy",
  "grpo_surprisal",
  "ktae",
  "maxrl",
  "pass_at_k",
  "reinforce_pp",
  "reinforce_pp_baseline",
  "tree_grpo",
  "treepo",
}
PAIR_LOSSES = {"dpo", "ipo", "simpo"}


@pytest.mark.parametrize("name", estimators.names())
def test_every_estimator_passes_the_kit(name):
  invariances = [testing.group_reward_shift()] if name in SHIFT_INVARIANT else []
  invariances += [testing.reward_scale()] if name in SCALE_INVARIANT else []
  testing.check_estimator(estimators.get(name), name=name, invariances=invariances, max_examples=3)


@pytest.mark.parametrize("name", losses.names())
def test_every_loss_passes_the_kit(name):
  group_sizes = (2,) if name in PAIR_LOSSES else (1, 2, 4)
  testing.check_loss(losses.get(name), name=name, group_sizes=group_sizes, max_examples=3)


def test_kit_catches_an_estimator_leaking_into_masked_positions():
  def leaky(rollout):
    return jnp.broadcast_to(rollout.rewards[:, None], rollout.shape).astype(jnp.float32)

  with pytest.raises(
    testing.ConformanceError, match=r"\[masked_zero\] leaky: advantages non-zero at masked"
  ):
    testing.check_estimator(leaky, max_examples=2)


def test_kit_catches_division_by_a_zero_group_std():
  def unsafe_grpo(rollout):
    grouped = rollout.rewards.reshape(-1, rollout.group_size)
    seq = (grouped - grouped.mean(1, keepdims=True)) / grouped.std(1, keepdims=True)
    return estimators.broadcast_to_tokens(seq.reshape(-1), rollout.mask)

  with pytest.raises(
    testing.ConformanceError,
    match=r"\[finite(_gradients)?\] unsafe_grpo: (advantages|gradient) not finite",
  ) as error:
    testing.check_estimator(unsafe_grpo, max_examples=2)
  assert "nan" in str(error.value) and "input: Rollout(B=8" in str(error.value)


def test_kit_catches_a_loss_with_nan_gradient_at_a_degenerate_input():
  def root_kl(outputs, rollout, estimate):
    """sqrt of the summed squared log-ratio: its gradient is NaN on-policy."""
    valid = as_bool(rollout.mask)
    d = jnp.where(valid, outputs.logprobs - rollout.behaviour_logprobs, 0.0)
    return jnp.sqrt(jnp.sum(d**2)), {}

  with pytest.raises(testing.ConformanceError, match=r"\[finite_gradients\] root_kl") as error:
    testing.check_loss(root_kl, max_examples=2)
  assert "on_policy=True" in str(error.value)


def test_kit_catches_a_broken_invariance():
  with pytest.raises(
    testing.ConformanceError, match=r"\[invariance:group_reward_shift\] reinforce"
  ):
    testing.check_estimator(
      estimators.get("reinforce"),
      name="reinforce",
      invariances=[testing.group_reward_shift()],
      max_examples=2,
    )


@given(testing.strategies.rollouts())
def test_strategy_draws_valid_rollouts(rollout):
  rollout.check()
  assert rollout.shape[0] % rollout.group_size == 0
  assert rollout.mask.dtype == jnp.bool_


def test_signal_diagnostics_match_numpy():
  rng = np.random.default_rng(0)
  rollout = testing.strategies.make_rollout(rng, batch=8, length=7, group_size=4)
  rollout = rollout.replace(rewards=jnp.array([1.0, 1, 1, 1, 0, 1, 0, 1]))
  advantages = estimators.get("grpo")(rollout).advantages
  got = estimators.signal_diagnostics(rollout.rewards, advantages, rollout.mask, group_size=4)
  mask, adv = np.asarray(rollout.mask), np.asarray(advantages)
  np.testing.assert_allclose(got["zero_variance_groups"], 0.5)
  np.testing.assert_allclose(got["zero_advantage_tokens"], (adv[mask] == 0).mean(), atol=1e-6)
  np.testing.assert_allclose(
    got["advantage_mass"], np.where(mask, np.abs(adv), 0).sum(1), rtol=1e-6
  )
  np.testing.assert_allclose(
    got["advantage_mass_mean"], np.where(mask, np.abs(adv), 0).sum(1).mean(), rtol=1e-6
  )


def test_readme_extension_example_runs_and_is_short():
  block = doc_block('register("best_of_group")')
  assert len(block.strip().splitlines()) < 30
  try:
    exec(block, {})
    rollout = testing.strategies.make_rollout(
      np.random.default_rng(0), batch=4, length=5, group_size=2
    )
    advantages = estimators.get("best_of_group")(rollout).advantages
    grouped = np.asarray(rollout.rewards).reshape(-1, 2)
    want = (grouped - grouped.max(1, keepdims=True)).reshape(-1)
    np.testing.assert_allclose(advantages, np.where(rollout.mask, want[:, None], 0.0))
  finally:
    estimators.REGISTRY.unregister("best_of_group")
    losses.REGISTRY.unregister("reinforce_with_kl")


def test_readme_composition_example_runs():
  rollout = testing.strategies.make_rollout(
    np.random.default_rng(1), batch=8, length=6, group_size=4
  )
  outputs = jc.PolicyOutputs(logprobs=rollout.behaviour_logprobs, entropy=rollout.entropy)
  namespace = {"rollout": rollout, "outputs": outputs, "step": 3}
  exec(doc_block("jc.losses.combine("), namespace)
  assert np.isfinite(namespace["loss"]) and "kl/value" in namespace["metrics"]


def test_kit_catches_a_normalisation_that_collapses_for_huge_rewards():
  def squaring_grpo(rollout):
    """GRPO with the centred rewards squared as they are: (1e19)^2 overflows float32."""
    grouped = rollout.rewards.astype(jnp.float32).reshape(-1, rollout.group_size)
    centred = grouped - grouped.mean(1, keepdims=True)
    std = jnp.sqrt(
      jnp.maximum(jnp.sum(centred**2, 1, keepdims=True) / max(rollout.group_size - 1, 1), 1e-12)
    )
    seq = centred / std
    return estimators.broadcast_to_tokens(seq.reshape(-1), rollout.mask)

  testing.check_estimator(
    squaring_grpo, max_examples=2, group_sizes=(2, 4)
  )  # fine at ordinary scales
  with pytest.raises(
    testing.ConformanceError, match=r"\[invariance:reward_scale\(1e\+19\)\] squaring_grpo"
  ):
    testing.check_estimator(
      squaring_grpo, max_examples=2, group_sizes=(2, 4), invariances=[testing.reward_scale()]
    )


def test_kit_catches_a_ratio_loss_that_overflows_for_a_stale_behaviour_policy():
  def naive_ppo(outputs, rollout, estimate):
    """PPO-clip with exp of the raw log-ratio: inf ratio, NaN gradient behind a finite clipped
    loss."""
    valid = as_bool(rollout.mask)
    log_ratio = jnp.where(valid, outputs.logprobs, 0.0) - jnp.where(
      valid, rollout.behaviour_logprobs, 0.0
    )
    ratio = jnp.exp(log_ratio)
    adv = jnp.where(valid, estimate.advantages, 0.0)
    tokens = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 0.8, 1.2))
    return losses.aggregate(jnp.where(adv > 0, tokens, 0.0), valid, "token-mean"), {}

  with pytest.raises(testing.ConformanceError, match=r"\[finite_gradients\] naive_ppo") as error:
    testing.check_loss(naive_ppo, max_examples=2)
  assert "large log-ratios" in str(error.value) and "log_ratio_shift=100.0" in str(error.value)
