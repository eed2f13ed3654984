"""Masking at agentic scale: episodes of many turns whose observations are thousands of
tokens long (`strategies.make_episodes`). Returns, values, turn credit, KL and entropy
never read an observation token: poisoning every observation position changes nothing,
and each result on the actions equals the one on the same episodes with their observations
cut out."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcredit import estimators, losses
from jaxcredit.rollout import PolicyOutputs, Rollout
from jaxcredit.testing import conformance, strategies

# The estimators that read turn structure, and those that carry returns or values from
# position to position (where an observation span could leak into an action's credit).
ESTIMATORS = ("turn_gae", "mt_grpo", "gigpo", "turn_baseline", "turn_vine", "gae", "n_step",
              "vtrace", "prime", "vineppo", "reinforce_pp", "grpo")
TURN_ESTIMATORS = ESTIMATORS[:5]
POISONS = (np.nan, 1e30, -np.inf)  # written over every observation position


@pytest.fixture(scope="module")
def episodes() -> Rollout:
  """4 episodes (groups of 2) of 3-6 turns of 4-40 action tokens, each observation 1,000 to
  3,000 tokens: T about 15k, under 2% of it actions."""
  return strategies.make_episodes(np.random.default_rng(0), batch=4, group_size=2,
                                  turns=(3, 6), action_tokens=(4, 40),
                                  observation_tokens=(1000, 3000))


def _per_token(rollout: Rollout, fn) -> Rollout:
  """`fn` applied to every [B, T] array of the rollout, its extras' included."""
  shape = rollout.shape
  apply = lambda x: fn(x) if hasattr(x, "shape") and x.shape == shape else x
  fields = {f.name: apply(getattr(rollout, f.name)) for f in dataclasses.fields(rollout)
            if f.name not in ("extras", "group_size")}
  return rollout.replace(**fields, extras={k: apply(v) for k, v in rollout.extras.items()})


def _pack(x, mask: np.ndarray) -> jax.Array:
  """Each row's values at `mask` packed left, zeros after."""
  x, width = np.asarray(x), int(mask.sum(axis=1).max())
  out = np.zeros((x.shape[0], width), x.dtype)
  for row in range(x.shape[0]):
    out[row, :mask[row].sum()] = x[row][mask[row]]
  return jnp.asarray(out)


def _compact(rollout: Rollout) -> Rollout:
  """The same episodes with every masked column cut out: each row's actions packed left."""
  mask = np.asarray(rollout.mask, bool)
  packed = _per_token(rollout, lambda x: _pack(x, mask))
  width = packed.shape[1]
  return packed.replace(mask=jnp.asarray(np.arange(width)[None] < mask.sum(axis=1)[:, None]))


def _on_actions(x, rollout: Rollout) -> list[np.ndarray]:
  mask = np.asarray(rollout.mask, bool)
  return [np.asarray(x)[row][mask[row]] for row in range(len(mask))]


@pytest.mark.parametrize("name", ESTIMATORS)
def test_no_estimator_reads_an_observation_token(episodes, name):
  full = jax.jit(estimators.get(name))
  estimate = lambda r: full(r).advantages
  clean = full(episodes)
  advantages = np.asarray(clean.advantages)
  mask = np.asarray(episodes.mask, bool)
  assert np.isfinite(advantages).all() and np.all(advantages[~mask] == 0)
  assert np.abs(advantages[mask]).max() > 0
  for value in POISONS:
    poisoned = full(conformance.poison_masked(episodes, value))
    np.testing.assert_array_equal(np.asarray(poisoned.advantages), advantages, err_msg=value)
    if clean.returns is not None:
      np.testing.assert_array_equal(np.asarray(poisoned.returns), np.asarray(clean.returns),
                                    err_msg=value)
  if name in TURN_ESTIMATORS:  # it does read the turn structure
    with pytest.raises(ValueError, match="turn_ids"):
      estimators.get(name)(episodes.replace(turn_ids=None))
  compact = _compact(episodes)
  for long, short in zip(_on_actions(advantages, episodes),
                         _on_actions(estimate(compact), compact)):
    np.testing.assert_allclose(long, short, rtol=1e-5, atol=1e-5)


def test_kl_and_entropy_never_read_an_observation_token(episodes):
  objective = losses.from_config({"policy": {"name": "ppo_clip"}, "kl": {"name": "kl"},
                                  "entropy": {"name": "entropy", "coef": 0.01}})

  def loss(rollout, logprobs, entropy):
    outputs = PolicyOutputs(logprobs=logprobs, entropy=entropy, values=rollout.values)
    return objective(outputs, rollout, estimators.get("grpo")(rollout))[0]

  def value_and_grads(rollout, logprobs):
    return jax.jit(jax.value_and_grad(loss, argnums=(1, 2)))(rollout, logprobs, rollout.entropy)

  mask = np.asarray(episodes.mask, bool)
  logprobs = episodes.behaviour_logprobs + 0.05 * jnp.cos(jnp.arange(episodes.shape[1]))
  value, grads = value_and_grads(episodes, logprobs)
  assert np.isfinite(value)
  for grad in grads:
    grad = np.asarray(grad)
    assert np.isfinite(grad).all() and np.all(grad[~mask] == 0) and np.abs(grad[mask]).max() > 0
  for poison in POISONS:
    poisoned_value, _ = value_and_grads(conformance.poison_masked(episodes, poison),
                                        jnp.where(episodes.mask, logprobs, poison))
    assert poisoned_value == value, poison
  compact = _compact(episodes)
  compact_value, compact_grads = value_and_grads(compact, _pack(logprobs, mask))
  np.testing.assert_allclose(compact_value, value, rtol=1e-5)
  for grad, compact_grad in zip(grads, compact_grads):
    for long, short in zip(_on_actions(grad, episodes), _on_actions(compact_grad, compact)):
      np.testing.assert_allclose(long, short, rtol=1e-4, atol=1e-9)


def test_the_checks_catch_credit_that_reads_observations(episodes):
  """A control: GAE run over every column (the mask ignored inside the recurrence) carries
  the observations' rewards and values into the actions' credit, and both checks see it."""
  leaky = jax.jit(lambda r: jnp.where(r.mask, estimators.gae(
      r.token_rewards, r.values, jnp.ones_like(r.mask), gamma=1.0, lam=0.95)[0], 0.0))
  advantages = np.asarray(leaky(episodes))
  assert np.isnan(np.asarray(leaky(conformance.poison_masked(episodes)))).any()
  compact = _compact(episodes)
  assert any(not np.allclose(long, short, atol=1e-3) for long, short in zip(
      _on_actions(advantages, episodes), _on_actions(leaky(compact), compact)))
