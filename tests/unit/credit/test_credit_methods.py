"""Credit methods that need rollouts, token statistics or a second model: KTAE, SPO, PRIME's PRM."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import scipy.special
import scipy.stats
from flax import nnx

from jaxcredit import estimators, tasks, testing
from jaxcredit.credit import implicit_prm, token_statistics
from jaxcredit.models import Transformer, preset
from jaxcredit.rollout import Rollout
from jaxcredit.sampling import generate


def _entropy(p):
  return 0.0 if p in (0, 1) else -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


def _kappa_reference(a, b, c, d, tf=0.0):
  """KTAE's kappa of one table in float64 (scipy's Fisher test, the entropies by hand)."""
  if a + c == 0 or b + d == 0:
    return 0.0
  p = scipy.stats.fisher_exact([[a, b], [c, d]]).pvalue
  fisher = 0.0 if p >= 1.0 else np.exp(-2 * p)
  n = a + b + c + d
  gain = _entropy((a + c) / n) - sum(k / n * _entropy(hits / k)
                                     for hits, k in ((a, a + b), (c, c + d)) if k)
  h = np.arcsin(np.sqrt(a / (a + c))) - np.arcsin(np.sqrt(b / (b + d)))
  return 2 * (scipy.special.expit((fisher + gain) * (h + tf) / 2) - 0.5)


def test_key_token_tables_against_scipys_fisher_test_and_the_entropies_by_hand():
  rng = np.random.default_rng(0)
  tables = [(3, 1, 0, 4), (0, 4, 3, 1), (2, 2, 2, 2), (4, 4, 0, 0), (5, 0, 0, 11)]
  for _ in range(200):
    n_correct, n_incorrect = rng.integers(0, 9, 2)
    a, b = rng.integers(0, n_correct + 1), rng.integers(0, n_incorrect + 1)
    tables.append((a, b, n_correct - a, n_incorrect - b))
  a, b, c, d = np.asarray(tables, np.float32).T
  got = token_statistics.key_token_table(a, b, c, d, 16)
  p = [scipy.stats.fisher_exact([[w, x], [y, z]]).pvalue for w, x, y, z in tables]
  np.testing.assert_allclose(token_statistics.fisher_p(a, b, c, d, 16), p, atol=2e-6)
  np.testing.assert_allclose(got["kappa"], [_kappa_reference(*t) for t in tables], atol=2e-6)
  assert got["kappa"][0] > 0 and got["kappa"][1] < 0  # with the successes / the failures
  assert got["kappa"][3] == 0.0  # no contrast


def _ktae_reference(tokens, mask, rewards, group_size):
  """KTAE with its TF term in float64, one group and one token type at a time."""
  out = np.zeros(tokens.shape)
  for start in range(0, len(tokens), group_size):
    rows = slice(start, start + group_size)
    t, m, correct = tokens[rows], mask[rows], rewards[rows] > 0
    length = {True: m[correct].sum(), False: m[~correct].sum()}
    mean_length = (length[True] + length[False]) / 2
    for v in np.unique(t[m]):
      held = ((t == v) & m).any(axis=1)
      a, b = np.sum(held & correct), np.sum(held & ~correct)
      tf = {}
      for side in (True, False):
        share = np.sum(((t == v) & m)[correct == side]) / max(length[side], 1)
        k = 2.0 * (1 - 0.5 + 0.5 * length[side] / max(mean_length, 1))
        tf[side] = share * 3.0 / (share + k)
      term = tf[True] / (tf[False] + 1e-5) - tf[False] / (tf[True] + 1e-5)
      kappa = _kappa_reference(a, b, correct.sum() - a, (~correct).sum() - b, term)
      out[rows][(t == v) & m] = kappa
  return out


def test_ktae_scores_put_each_types_kappa_on_its_tokens_per_group_jit_and_vmap():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 6, (12, 7))
  mask = rng.random((12, 7)) < 0.8
  mask[2] = False  # an empty response
  rewards = np.array([1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 1, 0], np.float32)  # group 2: all correct
  scores = lambda *x: token_statistics.ktae_scores(*x, group_size=4, vocab_size=6)
  got = np.asarray(jax.jit(scores)(tokens, mask, rewards))
  np.testing.assert_allclose(got, _ktae_reference(tokens, mask, rewards, 4), atol=2e-5)
  np.testing.assert_array_equal(got[4:8], 0.0)
  np.testing.assert_array_equal(got[~mask], 0.0)
  assert np.all(np.isfinite(got))
  stacked = jax.vmap(scores)(*(np.stack([x, x[::-1]]) for x in (tokens, mask, rewards)))
  np.testing.assert_allclose(stacked[1], scores(tokens[::-1], mask[::-1], rewards[::-1]),
                             atol=1e-6)
  without_tf = token_statistics.ktae_scores(tokens, mask, rewards, 4, vocab_size=6,
                                            term_frequency=False)
  for v in np.unique(tokens[:4][mask[:4]]):
    held = ((tokens[:4] == v) & mask[:4]).any(axis=1)
    correct = rewards[:4] > 0
    a, b = np.sum(held & correct), np.sum(held & ~correct)
    np.testing.assert_allclose(without_tf[:4][(tokens[:4] == v) & mask[:4]],
                               _kappa_reference(a, b, 2 - a, 2 - b), atol=2e-6)


def test_the_trainers_ktae_provider_scores_the_sampled_rollout():
  """extras.hook for ktae: the key-token scores of the rollout's tokens and rewards, over
  the policy's vocabulary."""
  from jaxcredit.credit import extras

  rollout = testing.strategies.make_rollout(np.random.default_rng(2), batch=8, length=7,
                                            group_size=4)
  tokens = np.random.default_rng(3).integers(0, 5, (8, 7))
  rollout = rollout.replace(tokens=jnp.asarray(tokens),
                            rewards=jnp.asarray([1, 0, 0, 1, 1, 0, 1, 0], jnp.float32))
  model = Transformer(preset("tiny", vocab_size=5, n_layers=1, d_model=16, n_heads=2,
                             n_kv_heads=2, d_ff=32), rngs=nnx.Rngs(0))
  hook = extras.hook(estimators.from_config("ktae"))
  got, _ = hook(extras.Context(task=None, model=model, examples=[], key=jax.random.key(0),
                               rl_step=0), rollout)
  np.testing.assert_allclose(got["ktae_scores"], _ktae_reference(
      tokens, np.asarray(rollout.mask), np.asarray(rollout.rewards), 4), atol=2e-5)


def test_ktae_and_spo_estimators():
  rollout = testing.strategies.make_rollout(np.random.default_rng(1), batch=8, length=7,
                                            group_size=4)
  mask = np.asarray(rollout.mask)
  grpo = np.asarray(estimators.get("grpo")(rollout).advantages)
  ktae = np.asarray(estimators.get("ktae")(rollout).advantages)
  np.testing.assert_allclose(
    ktae, grpo + np.where(mask, rollout.extras["ktae_scores"], 0.0), atol=1e-6
  )
  vine = np.asarray(estimators.get("vineppo")(rollout).advantages)
  spo = np.asarray(estimators.get("spo")(rollout, prob_threshold=0.5).advantages)
  confident = np.exp(np.asarray(rollout.behaviour_logprobs)) > 0.5
  np.testing.assert_allclose(spo, np.where(confident, 0.0, vine), atol=1e-6)
  assert (confident & mask).any() and (~confident & mask & (vine != 0)).any()


def test_implicit_prm_starts_at_the_policy_and_learns_the_outcome(tmp_path):
  config = ml_collections.ConfigDict(
    {"name": "key_token", "options": {"length": 6}, "train_size": 8, "test_size": 4}
  )
  task = tasks.make(config, data_dir=str(tmp_path), seed=0)
  model = Transformer(preset("tiny", vocab_size=32), rngs=nnx.Rngs(0))
  examples = [task.sources["train"][i] for i in range(4) for _ in range(4)]
  prompts = np.stack([e["prompt"] for e in examples])
  sample = generate(
    model,
    prompts,
    np.ones(prompts.shape, bool),
    jax.random.key(0),
    max_new_tokens=6,
    actions=task.actions,
  )
  rewards = task.score(np.asarray(sample.tokens)[:, 4:], np.asarray(sample.mask)[:, 4:], examples)
  rollout = Rollout(
    tokens=sample.tokens,
    mask=sample.mask,
    rewards=jnp.asarray(rewards),
    behaviour_logprobs=sample.logprobs,
    ref_logprobs=sample.logprobs,
    group_size=4,
    positions=sample.positions,
    token_valid=sample.token_valid,
  )
  prm = implicit_prm.ImplicitPRM(beta=0.5, learning_rate=3e-3)
  extras, metrics = prm(task, model, rollout)
  mask = np.asarray(sample.mask)
  np.testing.assert_allclose(
    np.asarray(extras["prm_logprobs"])[mask], np.asarray(sample.logprobs)[mask], atol=1e-4
  )
  losses = [metrics["prm_loss"]] + [prm(task, model, rollout)[1]["prm_loss"] for _ in range(20)]
  assert losses[-1] < 0.9 * losses[0], losses
  assert prm.prm is not model  # the policy itself is untouched
