"""Estimators declare the extras they need; providers registered in train compute them."""

import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcredit import demo, estimators
from jaxcredit.credit import extras, token_statistics
from jaxcredit.rollout import Rollout
from tests import reference


def test_advantage_configs_list_their_estimators_settings_and_needs():
  config = {
    "scale": "rms",
    "of": {
      "sum": [
        {"weight": 0.5, "name": "vineppo", "k": 9},
        "oracle_seq",
        {"mask": "high_entropy", "rho": 0.2, "of": {"name": "prime"}},
      ]
    },
  }
  found = [
    (c.name, dict(c.settings), c.needs)
    for c in estimators.components(estimators.from_config(config))
  ]
  assert found == [
    ("vineppo", {"k": 9, "positions": "all"}, ("mc_values", "mc_evaluated")),
    ("oracle_seq", {}, ("oracle_values",)),
    ("prime", {"beta": 0.05, "gamma": 1.0}, ("prm_logprobs",)),
  ]
  assert estimators.components(lambda rollout: None) == ()  # a hand-written advantage function


def test_estimators_that_need_nothing_get_no_hook():
  assert extras.hook(estimators.from_config({"sum": ["grpo", {"name": "gae", "lam": 0.9}]})) is None


def test_an_unknown_setting_is_refused_when_the_config_is_read():
  with pytest.raises(
    ValueError, match="Estimator 'vineppo' has no setting 'kk'; it takes: k, positions"
  ):
    estimators.from_config({"name": "vineppo", "kk": 4})
  with pytest.raises(ValueError, match="Estimator 'grpo' has no setting 'lam'"):
    estimators.from_config({"name": "grpo", "lam": 0.9})


def test_a_needed_extra_without_a_provider_is_named_at_set_up():
  with pytest.raises(
    ValueError, match=r"'remax' needs rollout.extras\['baseline_rewards'\], which no registered"
  ):
    extras.hook(estimators.from_config("remax"))


def test_a_user_estimator_and_its_provider_plug_in_through_the_registries():
  made = []

  @estimators.register("test_bonus", needs=("test_bonus",), settings={"size": 1.0})
  def bonus_credit(rollout: Rollout, *, weight: float = 1.0):
    return weight * jnp.where(rollout.mask, rollout.extra("test_bonus", by="test_bonus"), 0.0)

  @extras.register("test_bonus")
  def make_bonus(settings, *, temperature):
    made.append((dict(settings), temperature))
    return lambda context, rollout: (
      {"test_bonus": settings["size"] * rollout.rewards[:, None] * jnp.ones(rollout.shape)},
      {"bonus_calls": 1},
    )

  try:
    advantage = estimators.from_config(
      {
        "sum": [
          {"name": "test_bonus", "size": 2.0, "weight": 1.0},
          {"name": "test_bonus", "weight": 0.5},
        ]
      }
    )
    hook = extras.hook(advantage, temperature=0.7)
    assert made == [
      ({"weight": 1.0, "size": 2.0}, 0.7)
    ]  # one provider, from the first estimator needing it
    rollout = Rollout(
      tokens=jnp.zeros((2, 3), jnp.int32),
      mask=jnp.asarray([[0, 1, 1], [0, 1, 0]], bool),
      rewards=jnp.asarray([1.0, 0.0]),
      group_size=2,
    )
    computed, metrics = hook(extras.Context(None, None, [], jax.random.key(0), 0), rollout)
    assert metrics == {"bonus_calls": 1}
    estimate = advantage(rollout.replace(extras=computed))
    assert estimate.advantages.tolist() == [[0.0, 3.0, 3.0], [0.0, 0.0, 0.0]]
  finally:
    estimators.REGISTRY.unregister("test_bonus")
    extras.PROVIDERS.unregister("test_bonus")


def test_the_trainer_finds_the_labs_oracle_without_importing_the_lab():
  """Importing the training loop loads no lab module; asking for the oracle loads
  its provider through the "jaxcredit.extras" entry point."""
  code = (
    "import sys\n"
    "from jaxcredit import estimators\n"
    "from jaxcredit.credit import extras\nfrom jaxcredit.train import loop\n"
    "print(sorted(m for m in sys.modules if m.startswith('jaxcredit.lab')))\n"
    "hook = extras.hook(estimators.from_config('oracle'))\n"
    "print(hook is not None, 'jaxcredit.lab.providers' in sys.modules)\n"
  )
  result = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
  )
  assert result.stdout.splitlines() == ["[]", "True True"]


def test_traceable_providers_are_the_host_providers_of_their_keys_and_run_under_jit():
  """One function per extra for the training loop and the batched lab: the host provider of
  each traceable key returns what the function returns, and the function traces."""
  import jaxcredit.lab.providers  # noqa: F401  (registers shuffle_priorities)

  rollout = demo.sample_rollout()
  key = jax.random.key(3)
  context = extras.Context(task=None, model=types.SimpleNamespace(
      config=types.SimpleNamespace(vocab_size=16)), examples=[], key=key, rl_step=0)
  assert {"ktae_scores", "shuffle_priorities"} <= set(extras.TRACEABLE.names())
  for name in extras.TRACEABLE.names():
    fn = extras.TRACEABLE.get(name)
    host, metrics = extras.provider_factory(name, needed_by="test")({}, temperature=1.0)(
        context, rollout)
    traced = jax.jit(fn, static_argnums=2)(rollout, key, 16)
    assert metrics == {} and set(host) == set(traced) and name in host
    for extra in host:
      np.testing.assert_array_equal(np.asarray(host[extra]), np.asarray(traced[extra]))
  np.testing.assert_array_equal(  # ktae through its provider is token_statistics' scores
      np.asarray(extras.TRACEABLE.get("ktae_scores")(rollout, key, 16)["ktae_scores"]),
      np.asarray(token_statistics.ktae_scores(rollout.tokens, rollout.mask, rollout.rewards,
                                              rollout.group_size, vocab_size=16)))


def test_lambda_grpo_learns_its_exponent_by_adam_on_the_surrogates_gradient():
  """Each batch is weighed with the lam from before it; then lam takes one Adam step on
  d/dlam of -sum_i f_i A_i l_i / sum_i l_i (checked against the float64 reference's central
  difference: Adam's first step moves lam by its learning rate against the gradient's sign)."""
  config = {"name": "lambda_grpo_learned", "lam": 0.5, "r": 1.0, "lam_learning_rate": 0.1}
  hook = extras.hook(estimators.from_config(config))
  rollout = demo.sample_rollout()  # rewards 1 0 0 1 1 1 1 0, ragged lengths
  mask = np.array(rollout.mask)
  mask[0, 1:] = False  # a short right answer beside long ones
  rollout = rollout.replace(mask=jnp.asarray(mask))
  lengths = mask.sum(1)
  first, metrics = hook(None, rollout)
  assert metrics == {"lambda_grpo/lam": 0.5}
  np.testing.assert_allclose(first["length_weights"],
                             reference.lambda_grpo_weights(lengths, 4, 0.5), rtol=1e-5)
  step = 1e-5
  gradient = (reference.lambda_grpo_surrogate(0.5 + step, rollout.rewards, lengths, 4)
              - reference.lambda_grpo_surrogate(0.5 - step, rollout.rewards, lengths, 4)) / (
                  2 * step)
  assert abs(gradient) > 1e-3
  lam = float(hook.modules()["length_preference"].lam[...])
  np.testing.assert_allclose(lam, 0.5 - 0.1 * np.sign(gradient), rtol=1e-4)
  second, metrics = hook(None, rollout)
  np.testing.assert_allclose(metrics["lambda_grpo/lam"], lam)
  np.testing.assert_allclose(second["length_weights"],
                             reference.lambda_grpo_weights(lengths, 4, lam), rtol=1e-5)
  estimate = estimators.get("lambda_grpo_learned")(rollout.replace(extras=second))
  want = (reference.lambda_grpo_weights(lengths, 4, lam)
          * reference.grpo(rollout.rewards, 4))[:, None]
  np.testing.assert_allclose(estimate.advantages, np.where(mask, want, 0.0), atol=1e-5)
  fixed = estimators.get("lambda_grpo")(rollout, lam=lam)
  np.testing.assert_allclose(fixed.advantages, estimate.advantages, atol=1e-6)
  with pytest.raises(ValueError, match="lam_learning_rate must be > 0"):
    extras.hook(estimators.from_config({**config, "lam_learning_rate": 0.0}))


def test_rae_baselines_are_per_role_moving_averages_of_earlier_batches():
  """RAE subtracts each role's baseline from before the batch, then moves it toward the
  batch's mean reward of the role: b <- d b + (1 - d) mean r."""
  hook = extras.hook(estimators.from_config({"name": "rae", "decay": 0.5, "roles": 3}))
  rollout = demo.sample_rollout()  # rewards 1 0 0 1 1 1 1 0
  roles = jnp.array([0, 0, 0, 0, 2, 2, 2, 2])
  first, metrics = hook(None, rollout.replace(extras={"roles": roles}))
  np.testing.assert_array_equal(first["role_baselines"], 0.0)  # before any batch
  second, _ = hook(None, rollout.replace(extras={"roles": roles}))
  np.testing.assert_allclose(second["role_baselines"], [0.25] * 4 + [0.375] * 4)
  third, _ = hook(None, rollout)  # no roles: every row is role 0
  np.testing.assert_allclose(third["role_baselines"], 0.375)  # 0.5 * 0.25 + 0.5 * 0.5
  estimate = estimators.get("rae")(rollout.replace(extras=second))
  want = (np.asarray(rollout.rewards) - np.asarray(second["role_baselines"]))[:, None]
  np.testing.assert_allclose(estimate.advantages, np.where(rollout.mask, want, 0.0), atol=1e-6)
  state = hook.modules()["role_baselines"].values[...]
  np.testing.assert_allclose(state, [0.5, 0.0, 0.5625])  # role 0: 0.5 * 0.375 + 0.5 * 5 / 8
  assert "rae_baseline_mean" in metrics
  with pytest.raises(ValueError, match=r"extras\['roles'\] must be \[B\] = \[8\] int role ids "
                                       r"in \[0, 3\)"):
    hook(None, rollout.replace(extras={"roles": jnp.full(8, 3)}))
  with pytest.raises(ValueError, match="decay must be in"):
    extras.hook(estimators.from_config({"name": "rae", "decay": 1.0}))
