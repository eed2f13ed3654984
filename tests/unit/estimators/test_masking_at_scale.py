"""Masking at agentic scale: on long multi-turn layouts (a dozen turns of a few action tokens
between observation spans of up to thousands of tokens), the turn-level estimators' advantages
and returns, and the KL and entropy terms, never read an observation token."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcredit import estimators, losses
from jaxcredit.rollout import PolicyOutputs
from jaxcredit.testing import poison_masked, strategies

TURN_ESTIMATORS = ("turn_gae", "mt_grpo", "gigpo", "turn_baseline", "turn_vine")
POISONS = (np.nan, 1e30, -np.inf)


def _long_layout(rng, batch: int, length: int, turns: int):
  """mask, turn_ids [B, T]: a prompt, then turns of 1-8 action tokens, each followed by an
  observation of 200-3,000 tokens carrying the turn's id (as `MultiTurn` lays them out);
  -1 in the prompt and after the episode."""
  mask = np.zeros((batch, length), bool)
  turn_ids = np.full((batch, length), -1, np.int32)
  for row in range(batch):
    t = int(rng.integers(16, 64))
    for turn in range(turns):
      actions, observation = int(rng.integers(1, 9)), int(rng.integers(200, 3000))
      end = min(t + actions + observation, length)
      mask[row, t:min(t + actions, length)] = True
      turn_ids[row, t:end] = turn
      t = end
      if t == length:
        break
  return mask, turn_ids


@pytest.fixture(scope="module")
def rollout():
  rng = np.random.default_rng(0)
  batch, length = 4, 16_384
  base = strategies.make_rollout(rng, batch=batch, length=length, group_size=2)
  mask, turn_ids = _long_layout(rng, batch, length, turns=12)
  observations = (~mask) & (turn_ids >= 0)
  assert observations.sum(1).min() > 2_000 and mask.sum(1).max() < 200  # mostly observations
  return base.replace(mask=jnp.asarray(mask), turn_ids=jnp.asarray(turn_ids))


@pytest.mark.parametrize("name", TURN_ESTIMATORS)
def test_turn_estimators_never_read_observation_tokens(rollout, name):
  """Every float [B, T] input poisoned at the observations (and the prompt) with NaN, 1e30 or
  -inf: the same advantages and returns, finite, 0 off the actions."""
  estimate = jax.jit(estimators.get(name))
  clean = estimate(rollout)
  mask = np.asarray(rollout.mask)
  with pytest.raises(ValueError, match="turn_ids"):  # it does read the turn structure
    estimators.get(name)(rollout.replace(turn_ids=None))
  for value in POISONS:
    dirty = estimate(poison_masked(rollout, value))
    for field in ("advantages", "returns"):
      got, want = getattr(dirty, field), getattr(clean, field)
      if want is None:
        continue
      got, want = np.asarray(got), np.asarray(want)
      assert np.isfinite(got).all(), (name, field, value)
      np.testing.assert_array_equal(got, want, err_msg=f"{name}.{field} with {value}")
      if field == "advantages":
        assert not got[~mask].any(), (name, "credit on an observation token")
  assert np.asarray(clean.advantages)[mask].any()


@pytest.mark.parametrize("term", ["kl", "entropy"])
def test_kl_and_entropy_never_read_observation_tokens(rollout, term):
  """The policy's log-probs and entropies and the reference's log-probs poisoned at the
  observations: the same finite term and metrics, and a gradient of exactly 0 there."""
  fn = losses.get(term)
  rng = np.random.default_rng(1)
  outputs = PolicyOutputs(
      logprobs=rollout.behaviour_logprobs + 0.1 * jnp.asarray(rng.normal(size=rollout.shape),
                                                              jnp.float32),
      entropy=rollout.entropy)
  estimate = estimators.get("mt_grpo")(rollout)
  loss = jax.jit(lambda o, r: fn(o, r, estimate))
  clean, clean_metrics = loss(outputs, rollout)
  mask = rollout.mask
  for value in POISONS:
    poisoned = jax.tree.map(lambda x: jnp.where(mask, x, value), outputs)
    dirty, dirty_metrics = loss(poisoned, poison_masked(rollout, value))
    assert np.isfinite(dirty) and dirty == clean, (term, value, dirty, clean)
    assert dirty_metrics == clean_metrics
  grads = jax.grad(lambda o: fn(o, poison_masked(rollout, np.nan), estimate)[0])(outputs)
  for grad in jax.tree.leaves(grads):
    grad = np.asarray(grad)
    assert np.isfinite(grad).all() and not grad[~np.asarray(mask)].any(), term
  assert any(np.asarray(g)[np.asarray(mask)].any() for g in jax.tree.leaves(grads))
