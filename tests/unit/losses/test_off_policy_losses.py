"""Off-policy losses (three log-probs) against float64 references; their reduction to
ppo_clip on-policy; finite gradients at log-ratios of +-200; masked rows; bad input."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

import jaxcredit as jc
from jaxcredit import estimators, losses
from tests import reference
from tests.conftest import SHAPES, poison, random_mask


def _batch(shape, seed=0, spread=0.4):
  """logp, old, behaviour (valid log-probs, ratios and weights straddling 1), advantages,
  mask, staleness."""
  rng = np.random.default_rng(seed)
  old = -rng.exponential(1.5, size=shape) - 1e-3
  logp = np.minimum(old + spread * rng.normal(size=shape), -1e-3)
  behaviour = np.minimum(old + 1.5 * spread * rng.normal(size=shape), -1e-3)
  advantages = rng.normal(size=shape)
  staleness = rng.integers(0, 5, shape[0])
  f32 = lambda x: x.astype(np.float32)
  return f32(logp), f32(old), f32(behaviour), f32(advantages), random_mask(rng, shape), staleness


# name -> (loss(logp, old, behaviour, advantages, mask, staleness, **hp), float64 reference, hp)
CASES = {
    "tis": (
        lambda l, o, b, a, m, s, **hp: losses.tis_loss(l, o, b, a, m, **hp),
        lambda l, o, b, a, m, s, **hp: reference.tis(
            l, o, b, a, m, hp["cap"], hp["level"], 0.2, 0.28, hp["aggregation"]),
        [dict(cap=1.5, level="token", clip_high=0.28), dict(cap=3.0, level="sequence",
                                                             clip_high=0.28)]),
    "masked_is": (
        lambda l, o, b, a, m, s, **hp: losses.masked_is_loss(l, o, b, a, m, **hp),
        lambda l, o, b, a, m, s, **hp: reference.masked_is(
            l, o, b, a, m, hp["low"], hp["high"], hp["level"], 0.2, 0.2, hp["aggregation"]),
        [dict(low=0.6, high=1.5, level="token"), dict(low=0.8, high=1.25, level="sequence")]),
    "decoupled_ppo": (
        lambda l, o, b, a, m, s, **hp: losses.decoupled_ppo_loss(l, o, b, a, m, **hp),
        lambda l, o, b, a, m, s, **hp: reference.decoupled_ppo(
            l, o, b, a, m, hp["cap"], hp["cap_mode"], hp["level"], 0.2, 0.2, hp.get("dual_clip"),
            hp["aggregation"]),
        [dict(cap=1.5, cap_mode="mask", level="token", dual_clip=3.0),
         dict(cap=1.2, cap_mode="truncate", level="sequence")]),
    "opsm": (
        lambda l, o, b, a, m, s, **hp: losses.opsm_loss(l, o, b, a, m, **hp),
        lambda l, o, b, a, m, s, **hp: reference.opsm(l, o, b, a, m, hp["delta"], 0.2, 0.2,
                                                       hp["aggregation"]),
        [dict(delta=0.05), dict(delta=0.0)]),
    "dppo": (
        lambda l, o, b, a, m, s, **hp: losses.dppo_loss(l, o, a, m, **hp),
        lambda l, o, b, a, m, s, **hp: reference.dppo(
            l, o, a, m, hp["divergence"], hp["clip_low"], hp["clip_high"], hp["ratio_cap"],
            hp["aggregation"]),
        [dict(divergence="tv", clip_low=0.05, clip_high=0.1, ratio_cap=1.3),
         dict(divergence="kl", clip_low=0.02, clip_high=0.05, ratio_cap=20.0)]),
    "m2po": (
        lambda l, o, b, a, m, s, **hp: losses.m2po_loss(l, o, b, a, m, **hp),
        lambda l, o, b, a, m, s, **hp: reference.m2po(l, o, b, a, m, hp["threshold"],
                                                       hp["aggregation"]),
        [dict(threshold=0.04), dict(threshold=0.2)]),
    "sat": (
        lambda l, o, b, a, m, s, **hp: losses.sat_loss(l, o, a, m, s, **hp),
        lambda l, o, b, a, m, s, **hp: reference.sat(l, o, a, m, s, 0.2, 0.2, hp["decay"],
                                                      hp["aggregation"]),
        [dict(decay=0.5), dict(decay=2.0)]),
    "topr": (
        lambda l, o, b, a, m, s, **hp: losses.topr_loss(l, b, a, m, **hp),
        lambda l, o, b, a, m, s, **hp: reference.topr(l, b, a, m, hp["level"], hp["threshold"],
                                                       hp["aggregation"]),
        [dict(level="sequence", threshold=0.0), dict(level="token", threshold=0.3)]),
}
PARAMS = [(name, i) for name, (_, _, hps) in CASES.items() for i in range(len(hps))]


def _hparams(name, index, aggregation):
  return {**CASES[name][2][index], "aggregation": aggregation}


class OffPolicyReferenceTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(case=PARAMS, shape=[SHAPES[1], SHAPES[3]],
                         aggregation=["token-mean", "seq-mean-token-mean"])
  def test_matches_float64_reference(self, case, shape, aggregation):
    name, index = case
    fn, ref, _ = CASES[name]
    hp = _hparams(name, index, aggregation)
    logp, old, beh, adv, mask, stale = _batch(shape, seed=index)
    got, metrics = self.variant(functools.partial(fn, **hp))(
        poison(logp, mask), poison(old, mask, -np.inf), poison(beh, mask), poison(adv, mask),
        mask, stale)
    want = ref(logp.astype(np.float64), old.astype(np.float64), beh.astype(np.float64),
               adv.astype(np.float64), mask, stale, **hp)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert all(np.isfinite(v) and np.shape(v) == () for v in metrics.values()), metrics

  @parameterized.parameters(("tis", 0), ("masked_is", 0), ("decoupled_ppo", 1), ("m2po", 0),
                            ("sat", 0))
  def test_gradient_matches_float64_finite_differences(self, name, index):
    """Where the weights do not depend on logp, the reference's finite differences are
    the gradient."""
    fn, ref, _ = CASES[name]
    hp = _hparams(name, index, "token-mean")
    logp, old, beh, adv, mask, stale = _batch((4, 9), seed=3)
    grad = jax.grad(lambda l: fn(l, old, beh, adv, mask, stale, **hp)[0])(logp)
    f64 = lambda x: x.astype(np.float64)
    want = np.zeros(logp.shape)
    for idx in zip(*np.nonzero(mask)):
      step = np.zeros(logp.shape)
      step[idx] = 1e-6
      plus = ref(f64(logp) + step, f64(old), f64(beh), f64(adv), mask, stale, **hp)
      minus = ref(f64(logp) - step, f64(old), f64(beh), f64(adv), mask, stale, **hp)
      want[idx] = (plus - minus) / 2e-6
    np.testing.assert_allclose(grad, want, atol=1e-4)

  def test_score_function_gradients(self):
    """dppo and topr: d/d logp_t = -sg(weight_t) A_t / N at valid tokens."""
    logp, old, beh, adv, mask, _ = _batch((4, 9), seed=5)
    n = mask.sum()
    grad = jax.grad(lambda l: losses.dppo_loss(l, old, adv, mask, clip_low=0.05,
                                               clip_high=0.1)[0])(logp)
    p, q = np.exp(logp.astype(np.float64)), np.exp(old.astype(np.float64))
    keep = np.where(adv > 0, p - q <= 0.1, p - q >= -0.05)
    ratio = np.exp(logp - old.astype(np.float64))
    want = np.where(mask & keep, -adv * np.minimum(ratio, 20) / n, 0)
    np.testing.assert_allclose(grad, want, atol=1e-6)
    grad = jax.grad(lambda l: losses.topr_loss(l, beh, adv, mask, level="token")[0])(logp)
    alpha = np.where(adv <= 0, np.minimum(np.exp(logp.astype(np.float64) - beh), 1.0), 1.0)
    np.testing.assert_allclose(grad, np.where(mask, -alpha * adv / n, 0), atol=1e-6)

  def test_vmap_over_batches(self):
    batches = [_batch((3, 7), seed=s) for s in range(3)]
    stacked = [np.stack(x) for x in zip(*batches)]
    for name, index in PARAMS:
      fn, _, _ = CASES[name]
      hp = _hparams(name, index, "token-mean")
      got = jax.jit(jax.vmap(lambda *a: fn(*a, **hp)[0]))(*stacked)
      want = [fn(*b, **hp)[0] for b in batches]
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def _on_policy_rollout(seed=0):
  logp, _, _, adv, mask, stale = _batch((6, 8), seed=seed)
  rollout = jc.Rollout(
    tokens=jnp.zeros(mask.shape, jnp.int32),
    mask=jnp.asarray(mask),
    rewards=jnp.asarray(np.arange(6) % 2, jnp.float32),
    behaviour_logprobs=jnp.asarray(logp),
    old_logprobs=jnp.asarray(logp),
    staleness=jnp.asarray(stale),
    group_size=2,
  )
  return rollout, jc.Estimate(advantages=jnp.asarray(np.where(mask, adv, 0.0), jnp.float32))


RATIO_FORM = ("tis", "masked_is", "decoupled_ppo", "opsm", "m2po", "sat")


@pytest.mark.parametrize("name", RATIO_FORM + ("dppo", "topr"))
def test_on_policy_reduces_to_ppo_clip(name):
  """behaviour = proximal = current: the ratio-form losses equal ppo_clip, and every loss has
  ppo_clip's gradient (r = 1, w = 1: nothing clipped, masked or truncated)."""
  rollout, estimate = _on_policy_rollout()
  outputs = jc.PolicyOutputs(logprobs=rollout.behaviour_logprobs)
  value_and_grad = lambda loss: jax.value_and_grad(
    lambda o: losses.get(loss)(o, rollout, estimate)[0]
  )(outputs)
  value, grad = value_and_grad(name)
  ppo_value, ppo_grad = value_and_grad("ppo_clip")
  np.testing.assert_allclose(grad.logprobs, ppo_grad.logprobs, atol=1e-7)
  if name in RATIO_FORM:
    np.testing.assert_allclose(value, ppo_value, atol=1e-7)


@pytest.mark.parametrize("case", PARAMS)
@pytest.mark.parametrize("shift", [200.0, -200.0])
def test_finite_gradient_at_huge_log_ratios(case, shift):
  """Log-ratios of +-200 between the policy, proximal and behaviour log-probs."""
  name, index = case
  fn, _, _ = CASES[name]
  hp = _hparams(name, index, "token-mean")
  logp, old, beh, adv, mask, stale = _batch((4, 8), seed=7)
  rng = np.random.default_rng(0)
  sign = np.where(rng.random(logp.shape) < 0.5, 1.0, -1.0).astype(np.float32)
  far = np.float32(-1.0 - abs(shift))
  logp = np.where(sign * shift > 0, np.float32(-1.0), far)  # logp - old = +-199
  old = np.where(sign * shift > 0, far, np.float32(-1.0))
  beh = np.where(rng.random(logp.shape) < 0.5, far, np.float32(-0.5))
  value, grad = jax.value_and_grad(lambda l: fn(l, old, beh, adv, mask, stale, **hp)[0])(logp)
  assert np.isfinite(value) and np.all(np.isfinite(grad)), (name, value)
  np.testing.assert_array_equal(np.asarray(grad)[~mask], 0.0)


@pytest.mark.parametrize("case", PARAMS)
def test_fully_masked_rows_contribute_nothing(case):
  name, index = case
  fn, _, _ = CASES[name]
  hp = _hparams(name, index, "token-mean")
  logp, old, beh, adv, mask, stale = _batch((5, 8), seed=11)
  mask[2] = False
  for x in (logp, old, beh, adv):
    x[2] = np.nan
  stale[2] = 1000
  keep = np.arange(5) != 2
  full, _ = fn(logp, old, beh, adv, mask, stale, **hp)
  without, _ = fn(*(x[keep] for x in (logp, old, beh, adv, mask, stale)), **hp)
  np.testing.assert_allclose(full, without, rtol=1e-6)


def test_m2_keep_mask_matches_reference_and_meets_the_threshold():
  rng = np.random.default_rng(2)
  for _ in range(20):
    log_w = (rng.normal(size=(6, 9)) * rng.choice([0.05, 0.5, 2.0])).astype(np.float32)
    mask = random_mask(rng, log_w.shape)
    keep = np.asarray(losses.m2_keep_mask(jnp.asarray(log_w), mask, 0.04))
    np.testing.assert_array_equal(keep, reference.m2_keep(log_w, mask, 0.04))
    if keep.sum() > 1:  # else the fallback: every token but the smallest-M2 one dropped
      assert np.mean(np.square(log_w[keep].astype(np.float64))) < 0.04


def test_loglinear_proximal_matches_reference_and_is_behaviour_when_fresh():
  logp, _, beh, _, mask, stale = _batch((5, 7), seed=4)
  got = losses.loglinear_proximal_logprobs(logp, beh, stale, mask)
  want = reference.loglinear_proximal(logp.astype(np.float64), beh.astype(np.float64), stale, mask)
  np.testing.assert_allclose(np.where(mask, got, 0), want, atol=1e-6)
  fresh = losses.loglinear_proximal_logprobs(logp, beh, np.ones(5, int), mask)
  np.testing.assert_array_equal(np.where(mask, fresh, 0), np.where(mask, beh, 0))


def test_loglinear_decoupled_ppo_through_the_registry():
  rollout, estimate = _on_policy_rollout(seed=1)
  rollout = rollout.replace(old_logprobs=None, behaviour_logprobs=rollout.behaviour_logprobs - 0.1)
  outputs = jc.PolicyOutputs(logprobs=rollout.behaviour_logprobs + 0.1)
  got, _ = losses.get("decoupled_ppo")(outputs, rollout, estimate, proximal="loglinear")
  prox = losses.loglinear_proximal_logprobs(
    outputs.logprobs, rollout.behaviour_logprobs, rollout.staleness, rollout.mask
  )
  want, _ = losses.decoupled_ppo_loss(
    outputs.logprobs, prox, rollout.behaviour_logprobs, estimate.advantages, rollout.mask
  )
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_compose_with_any_estimator():
  rollout, _ = _on_policy_rollout(seed=2)
  rollout = rollout.replace(behaviour_logprobs=rollout.behaviour_logprobs - 0.2)
  objective = losses.combine(policy=losses.term("tis", cap=2.0), kl=losses.term("m2po"))
  outputs = jc.PolicyOutputs(logprobs=rollout.old_logprobs + 0.05)
  for name in ("grpo", "rloo", "dr_grpo"):
    loss, metrics = objective(outputs, rollout, estimators.get(name)(rollout))
    assert np.isfinite(loss) and "policy/is_truncated_fraction" in metrics


@pytest.mark.parametrize("name", ["tis", "masked_is", "decoupled_ppo", "opsm", "m2po", "topr"])
def test_missing_behaviour_logprobs_names_the_loss_and_field(name):
  rollout, estimate = _on_policy_rollout()
  outputs = jc.PolicyOutputs(logprobs=rollout.old_logprobs)
  with pytest.raises(ValueError, match=f"{name} needs rollout.behaviour_logprobs"):
    losses.get(name)(outputs, rollout.replace(behaviour_logprobs=None), estimate)


@pytest.mark.parametrize("name", ["tis", "masked_is", "decoupled_ppo", "m2po"])
def test_missing_old_logprobs_is_an_error_not_a_unit_weight(name):
  rollout, estimate = _on_policy_rollout()
  outputs = jc.PolicyOutputs(logprobs=rollout.old_logprobs)
  with pytest.raises(
    ValueError, match=f"{name} needs rollout.old_logprobs.*recompute_old_logprobs"
  ):
    losses.get(name)(outputs, rollout.replace(old_logprobs=None), estimate)


def test_bad_hyperparameters_name_the_field():
  logp, old, beh, adv, mask, stale = _batch((2, 4))
  with pytest.raises(ValueError, match="low <= high"):
    losses.masked_is_loss(logp, old, beh, adv, mask, low=2.0, high=1.0)
  with pytest.raises(ValueError, match="cap must be > 0"):
    losses.tis_loss(logp, old, beh, adv, mask, cap=0.0)
  with pytest.raises(ValueError, match="cap must be > 0"):
    losses.decoupled_ppo_loss(logp, old, beh, adv, mask, cap=-1.0)
  with pytest.raises(ValueError, match="Unknown importance-weight level 'row'"):
    losses.tis_loss(logp, old, beh, adv, mask, level="row")
  with pytest.raises(ValueError, match="needs the staleness"):
    losses.decoupled_ppo_loss(logp, None, beh, adv, mask, proximal="loglinear")
  with pytest.raises(ValueError, match=r"staleness must have shape \[B\]"):
    losses.sat_loss(logp, old, adv, mask, stale[:1])
  rollout, estimate = _on_policy_rollout()
  with pytest.raises(ValueError, match="sat needs rollout.staleness"):
    losses.get("sat")(
      jc.PolicyOutputs(rollout.old_logprobs), rollout.replace(staleness=None), estimate
    )
