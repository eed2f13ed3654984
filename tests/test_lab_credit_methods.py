"""Credit methods that need rollouts, token statistics or a second model: KTAE, SPO, PRIME's PRM."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from jaxcredit import estimators, testing
from jaxcredit.models import Transformer, preset
from jaxcredit.rollout import Rollout
from jaxcredit.sampling import generate
from jaxcredit.train import implicit_prm, tasks, token_statistics


def _entropy(p):
  return 0.0 if p in (0, 1) else -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


def test_key_token_table_against_hand_computation():
  present = np.array([1, 1, 1, 0, 0, 1, 0, 0], bool)
  correct = np.array([1, 1, 1, 0, 0, 0, 0, 0], bool)  # a=3, b=1, c=0, d=4
  got = token_statistics.key_token_table(present, correct)
  assert got["h"] == pytest.approx(np.arcsin(1.0) - np.arcsin(np.sqrt(1 / 5)))
  want_ig = _entropy(3 / 8) - (4 / 8 * _entropy(3 / 4) + 4 / 8 * _entropy(0.0))
  assert got["IG"] == pytest.approx(want_ig)
  # Fisher's exact test by enumeration of the hypergeometric tables with the same margins.
  from math import comb
  prob = lambda a: comb(4, a) * comb(4, 3 - a) / comb(8, 3)
  p = sum(prob(a) for a in range(4) if prob(a) <= prob(3) + 1e-12)
  assert got["F"] == pytest.approx(np.exp(-2 * p))
  assert got["kappa"] == pytest.approx(2 * (1 / (1 + np.exp(-(got["F"] + got["IG"]) * got["h"] / 2)) - 0.5))
  assert got["kappa"] > 0
  assert token_statistics.key_token_table(~present, correct)["kappa"] < 0  # absent from successes: negative
  assert token_statistics.key_token_table(present, np.ones(8, bool))["kappa"] == 0.0  # no contrast


def test_ktae_scores_put_each_types_kappa_on_its_tokens_per_group():
  rng = np.random.default_rng(0)
  tokens = rng.integers(5, 9, (8, 6))
  mask = rng.random((8, 6)) < 0.8
  rewards = np.array([1, 0, 1, 0, 1, 1, 1, 1], np.float32)  # second group: all correct
  got = token_statistics.ktae_scores(tokens, mask, rewards, group_size=4)
  np.testing.assert_array_equal(got[4:], 0.0)
  np.testing.assert_array_equal(got[~mask], 0.0)
  for v in np.unique(tokens[:4][mask[:4]]):
    present = ((tokens[:4] == v) & mask[:4]).any(axis=1)
    kappa = token_statistics.key_token_table(present, rewards[:4] > 0.5)["kappa"]
    np.testing.assert_allclose(got[:4][(tokens[:4] == v) & mask[:4]], kappa)


def test_ktae_and_spo_estimators():
  rollout = testing.strategies.make_rollout(np.random.default_rng(1), batch=8, length=7, group_size=4)
  mask = np.asarray(rollout.mask)
  grpo = np.asarray(estimators.get("grpo")(rollout).advantages)
  ktae = np.asarray(estimators.get("ktae")(rollout).advantages)
  np.testing.assert_allclose(ktae, grpo + np.where(mask, rollout.extras["ktae_scores"], 0.0), atol=1e-6)
  vine = np.asarray(estimators.get("vineppo")(rollout).advantages)
  spo = np.asarray(estimators.get("spo")(rollout, prob_threshold=0.5).advantages)
  confident = np.exp(np.asarray(rollout.behaviour_logprobs)) > 0.5
  np.testing.assert_allclose(spo, np.where(confident, 0.0, vine), atol=1e-6)
  assert (confident & mask).any() and (~confident & mask & (vine != 0)).any()


def test_implicit_prm_starts_at_the_policy_and_learns_the_outcome(tmp_path):
  config = ml_collections.ConfigDict({"name": "key_token", "options": {"length": 6}, "train_size": 8, "test_size": 4})
  task = tasks.make(config, data_dir=str(tmp_path), seed=0)
  model = Transformer(preset("tiny", vocab_size=32), rngs=nnx.Rngs(0))
  examples = [task.sources["train"][i] for i in range(4) for _ in range(4)]
  prompts = np.stack([e["prompt"] for e in examples])
  sample = generate(model, prompts, np.ones(prompts.shape, bool), jax.random.key(0), max_new_tokens=6,
                    actions=task.actions)
  rewards = task.score(np.asarray(sample.tokens)[:, 4:], np.asarray(sample.mask)[:, 4:], examples)
  rollout = Rollout(tokens=sample.tokens, mask=sample.mask, rewards=jnp.asarray(rewards), behaviour_logprobs=sample.logprobs,
                    ref_logprobs=sample.logprobs, group_size=4, positions=sample.positions,
                    token_valid=sample.token_valid)
  prm = implicit_prm.ImplicitPRM(beta=0.5, learning_rate=3e-3)
  extras, metrics = prm(task, model, rollout)
  mask = np.asarray(sample.mask)
  np.testing.assert_allclose(np.asarray(extras["prm_logprobs"])[mask], np.asarray(sample.logprobs)[mask], atol=1e-4)
  losses = [metrics["prm_loss"]] + [prm(task, model, rollout)[1]["prm_loss"] for _ in range(20)]
  assert losses[-1] < 0.9 * losses[0], losses
  assert prm.prm is not model  # the policy itself is untouched
