"""Oracle credit: exact E-DEC vs brute-force enumeration, Monte Carlo vs exact
within its standard error, and the pure helpers vs NumPy references."""

import itertools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from jaxcredit import tasks
from jaxcredit.credit import monte_carlo, rao_blackwell
from jaxcredit.models import Transformer, preset
from jaxcredit.sampling import generate
from jaxcredit.tasks import exact, key_token
from tests.conftest import random_mask

OPTIONS = {"length": 6, "n_decisive": 2, "n_keys": 3, "n_fillers": 2, "filler_blind": True}


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
  config = ml_collections.ConfigDict(
    {"name": "key_token", "options": OPTIONS, "train_size": 8, "test_size": 4}
  )
  task = tasks.make(config, data_dir=str(tmp_path_factory.mktemp("data")), seed=0)
  model = Transformer(preset("tiny", vocab_size=key_token.VOCAB_SIZE), rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)
  state = nnx.state(
    model, nnx.Param
  )  # peaked, prompt-dependent conditionals instead of near-uniform ones
  nnx.update(
    model, jax.tree.map(lambda x: x * 4 + 0.05 * rng.normal(size=x.shape).astype(x.dtype), state)
  )
  examples = [task.sources["train"][i] for i in range(4) for _ in range(4)]
  prompts = np.stack([e["prompt"] for e in examples])
  sample = generate(
    model,
    prompts,
    np.ones(prompts.shape, bool),
    jax.random.key(1),
    max_new_tokens=6,
    actions=task.actions,
  )
  return task, model, examples, sample


_log_softmax = nnx.jit(exact.masked_log_softmax)


def _teacher_forced_logprobs(model, inputs: np.ndarray, allowed: np.ndarray) -> np.ndarray:
  """[n, L, V] float64: [:, i] is log pi(. | inputs[:, :i + 1]), the distribution of token
  i + 1, restricted to allowed[i + 1] (allowed: [L, V] over row columns)."""
  allowed_next = np.concatenate([allowed[1:], np.ones_like(allowed[:1])])
  return np.asarray(_log_softmax(model, jnp.asarray(inputs), jnp.asarray(allowed_next)),
                    np.float64)


def _brute_force_values(model, config, examples, tokens):
  """V(s_t) by enumerating every allowed response (teacher-forced probabilities, float64)."""
  allowed = key_token.allowed(config)
  responses = np.asarray(list(itertools.product(*[np.flatnonzero(a) for a in allowed])))
  tokens, p = np.asarray(tokens), config.prompt_length
  values = np.zeros(tokens.shape)
  for row, example in enumerate(examples):
    rows = np.concatenate([np.tile(example["prompt"], (len(responses), 1)), responses], 1)
    logp = _teacher_forced_logprobs(
      model,
      np.concatenate([rows[:, :p], key_token.observe(responses, config)], 1),
      np.concatenate([np.ones((p, key_token.VOCAB_SIZE), bool), allowed]),
    )
    step_logp = np.take_along_axis(logp[:, p - 1 : -1], responses[..., None], 2)[..., 0]  # [S, T]
    rewards = key_token.reward(responses, np.tile(example["targets"], (len(responses), 1)), config)
    for t in range(config.length):
      consistent = (responses[:, :t] == tokens[row, p : p + t]).all(axis=1)
      log_weights = step_logp[consistent, t:].sum(axis=1)
      weights = np.exp(log_weights - log_weights.max())
      values[row, p + t] = np.sum(weights * rewards[consistent]) / np.sum(weights)
  return values


def test_decisive_oracle_equals_brute_force_enumeration(setting):
  task, model, examples, sample = setting
  targets = np.stack([e["targets"] for e in examples])
  exact = key_token.oracle.decisive_credit(
    model, key_token.KeyTokenConfig(**OPTIONS), sample.tokens, sample.mask, targets
  )
  mask = np.asarray(sample.mask)
  want = _brute_force_values(model, key_token.KeyTokenConfig(**OPTIONS), examples, sample.tokens)
  np.testing.assert_allclose(np.asarray(exact.values)[mask], want[mask], atol=1e-5)
  # F1: credit telescopes to R - V(x); filler carries none (filler-blind, Proposition 1 (iii)).
  rewards = task.score(np.asarray(sample.tokens)[:, 4:], mask[:, 4:], examples)
  np.testing.assert_allclose(np.asarray(exact.advantages).sum(1), rewards - want[:, 4], atol=1e-5)
  decisive = np.zeros(mask.shape, bool)
  decisive[:, 4 + key_token.KeyTokenConfig(**OPTIONS).decisive_positions] = True
  assert np.all(np.asarray(exact.advantages)[~decisive] == 0)
  assert np.abs(np.asarray(exact.advantages)[decisive]).max() > 0.01
  with pytest.raises(ValueError, match="filler_blind"):
    key_token.oracle.decisive_credit(model, key_token.KeyTokenConfig(), sample.tokens,
                                     sample.mask, targets)


VISIBLE = {"length": 6, "n_decisive": 2, "n_keys": 3, "n_fillers": 2}  # filler seen by later inputs


@pytest.mark.parametrize("rule", key_token.RULES)
def test_tree_oracle_equals_brute_force_enumeration_with_visible_filler(setting, rule):
  model = setting[1]
  config = key_token.KeyTokenConfig(**VISIBLE, rule=rule)
  rng = np.random.default_rng(2)
  examples = [e for e in (key_token.make_example(rng, config) for _ in range(4)) for _ in range(4)]
  prompts, targets = (np.stack([e[k] for e in examples]) for k in ("prompt", "targets"))
  sample = generate(
    model,
    prompts,
    np.ones(prompts.shape, bool),
    jax.random.key(2),
    max_new_tokens=config.length,
    actions=key_token.row_actions(config),
  )
  credit = key_token.oracle.tree_credit(model, config, sample.tokens, sample.mask, targets)
  mask, p = np.asarray(sample.mask), config.prompt_length
  want = _brute_force_values(model, config, examples, sample.tokens)
  np.testing.assert_allclose(np.asarray(credit.values)[mask], want[mask], atol=1e-5)
  advantages = np.asarray(credit.advantages)
  rewards = key_token.reward(np.asarray(sample.tokens)[:, p:], targets, config)
  np.testing.assert_allclose(advantages.sum(1), rewards - want[:, p], atol=1e-5)  # telescopes
  # Visible filler before the last decisive position carries credit (Proposition 1: the
  # later keys' conditionals read it); filler after it carries none (pruning (i)).
  last, filler = config.decisive_positions[-1], np.ones(config.length, bool)
  filler[config.decisive_positions] = False
  assert np.abs(advantages[:, p:][:, filler & (np.arange(config.length) < last)]).max() > 1e-4
  assert np.all(advantages[:, p + last + 1 :] == 0)
  # E-TREE's count: |F|^(p_K - K + 1) paths, times |C|^(K - 1) unless a wrong key decides R.
  branching = 1 if rule == "all" else config.n_keys ** (config.n_decisive - 1)
  assert key_token.oracle.passes_per_prompt(config) == 2 ** (last - 1) * branching
  assert credit.cost["passes"] == 4 * key_token.oracle.passes_per_prompt(config)


def test_tree_oracle_equals_the_decisive_oracle_when_filler_is_blind(setting):
  _, model, examples, sample = setting
  config, targets = key_token.KeyTokenConfig(**OPTIONS), np.stack([e["targets"] for e in examples])
  tree = key_token.oracle.tree_credit(model, config, sample.tokens, sample.mask, targets)
  decisive = key_token.oracle.decisive_credit(model, config, sample.tokens, sample.mask, targets)
  for got, want in ((tree.values, decisive.values), (tree.advantages, decisive.advantages)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
  with pytest.raises(
    ValueError,
    match=r"E-TREE needs 32 teacher-forced paths \(4 prompts x "
    r"8\), over max_passes = 31",
  ):
    key_token.oracle.tree_credit(model, config, sample.tokens, sample.mask, targets, max_passes=31)


def _exact_and_mc(setting, *, k, seed):
  task, model, examples, sample = setting
  targets = np.stack([e["targets"] for e in examples])
  exact = key_token.oracle.decisive_credit(
    model, key_token.KeyTokenConfig(**OPTIONS), sample.tokens, sample.mask, targets
  )
  mc = monte_carlo.mc_credit(
    model,
    task,
    sample.tokens,
    sample.mask,
    sample.token_valid,
    examples,
    jax.random.key(seed),
    k=k,
    positions="all",
  )
  return exact, mc


def test_monte_carlo_values_agree_with_the_exact_oracle_within_their_standard_error(setting):
  task, _, examples, sample = setting
  exact, mc = _exact_and_mc(setting, k=128, seed=2)
  mask = np.asarray(sample.mask)
  np.testing.assert_array_equal(np.asarray(mc.evaluated), mask)
  se = np.asarray(
    monte_carlo.mc_value_stats(jnp.zeros((1, 128)), jnp.ones((1, 128), bool))[2]
  )  # AC floor
  value_se = np.maximum(
    np.sqrt(np.clip(np.asarray(exact.values) * (1 - np.asarray(exact.values)), 0, None) / 128),
    se[0] / 4,
  )
  z = (np.asarray(mc.values) - np.asarray(exact.values))[mask] / value_se[mask]
  assert np.abs(z).max() < 4.5, np.abs(z).max()
  assert 0.3 < np.mean(z**2) < 2.0, np.mean(z**2)
  # Plain MC credit telescopes exactly to R - V_hat(x) (test T1).
  rewards = task.score(np.asarray(sample.tokens)[:, 4:], mask[:, 4:], examples)
  np.testing.assert_allclose(
    np.asarray(mc.advantages).sum(1), rewards - np.asarray(mc.values)[:, 4], atol=1e-5
  )
  assert mc.cost["rollouts"] == mask.sum() * 128 and mc.cost["gen_tokens"] > 0
  assert np.all(np.asarray(mc.adv_stderr)[mask] > 0)


def test_budgeted_monte_carlo_evaluates_fewer_positions(setting):
  task, model, examples, sample = setting
  mc = monte_carlo.mc_credit(
    model,
    task,
    sample.tokens,
    sample.mask,
    sample.token_valid,
    examples,
    jax.random.key(3),
    k=4,
    positions="stride:3",
  )
  evaluated = np.asarray(mc.evaluated)
  np.testing.assert_array_equal(evaluated.sum(1), 2)  # response steps 0 and 3 of 6
  assert mc.cost["rollouts"] == evaluated.sum() * 4


def test_mc_value_stats_against_numpy():
  rng = np.random.default_rng(0)
  returns = rng.integers(0, 2, (6, 10)).astype(np.float32)
  returns[0] = 1.0
  valid = rng.random((6, 10)) < 0.8
  valid[1] = False
  mean, var, se = (
    np.asarray(x) for x in monte_carlo.mc_value_stats(jnp.asarray(returns), jnp.asarray(valid))
  )
  for m in range(6):
    r = returns[m][valid[m]]
    if len(r) == 0:
      assert mean[m] == 0 and se[m] == 0.5
      continue
    assert np.isclose(mean[m], r.mean())
    if len(r) > 1:
      assert np.isclose(var[m], r.var(ddof=1), atol=1e-6)
    p = (r.sum() + 2) / (len(r) + 4)
    assert np.isclose(se[m], np.sqrt(p * (1 - p) / len(r)), atol=1e-6)
  assert se[0] > 0  # all successes still report uncertainty (Agresti-Coull)
  real = rng.normal(size=(3, 5)).astype(np.float32)
  _, _, se_real = monte_carlo.mc_value_stats(jnp.asarray(real), jnp.ones((3, 5), bool),
                                             binary=False)
  np.testing.assert_allclose(se_real, real.std(axis=1, ddof=1) / np.sqrt(5), rtol=1e-5)


def test_select_positions():
  rng = np.random.default_rng(1)
  mask = random_mask(rng, (6, 12))
  logprobs = np.log(rng.random((6, 12)))
  np.testing.assert_array_equal(monte_carlo.select_positions(mask, None, "all"), mask)
  stride = np.asarray(monte_carlo.select_positions(mask, None, "stride:3"))
  cut = np.asarray(monte_carlo.select_positions(mask, logprobs, "cutpoints:0.5"))
  for b in range(6):
    actions = np.flatnonzero(mask[b])
    np.testing.assert_array_equal(np.flatnonzero(stride[b]), actions[::3])
    want = [t for i, t in enumerate(actions) if i == 0 or np.exp(logprobs[b, t]) < 0.5]
    np.testing.assert_array_equal(np.flatnonzero(cut[b]), want)
  with pytest.raises(ValueError, match="Unknown positions 'every'"):
    monte_carlo.select_positions(mask, None, "every")
  # Traced: the rule's stride and threshold as arguments of one compiled function.
  traced = jax.jit(monte_carlo.evaluated_positions)
  for spec, want in (("all", mask), ("stride:3", stride), ("cutpoints:0.5", cut)):
    stride_k, threshold = monte_carlo.position_rule(spec)
    np.testing.assert_array_equal(traced(mask, logprobs, jnp.int32(stride_k),
                                         jnp.float32(threshold)), want)
  for spec in ("stride:0", "cutpoints:1.5", "stride:x"):
    with pytest.raises(ValueError, match="positions"):
      monte_carlo.position_rule(spec)


def test_calibration_check_accepts_mc_values_and_rejects_an_off_by_one_bug(setting):
  """Tests T2 and T4 of Monte-Carlo values: correct MC values pass the X^2 test; V_hat(s_{t+1})
  stored at t fails."""
  from studies.credit_study import runner as study

  exact, mc = _exact_and_mc(setting, k=64, seed=4)
  good = study.monte_carlo_check(exact.values, mc, 64, np.random.default_rng(0))
  assert good["states"] > 10 and good["passes_t2"], good
  shifted = np.concatenate([np.asarray(mc.values)[:, 1:], np.asarray(mc.values)[:, -1:]], axis=1)
  bad = study.monte_carlo_check(
    exact.values, mc.replace(values=jnp.asarray(shifted)), 64, np.random.default_rng(0)
  )
  assert not bad["passes_t2"] and bad["x2"] > bad["x2_null_q999"], bad


def test_rao_blackwellised_credit_agrees_with_the_exact_oracle(setting):
  """Test T3: rb credit (1 - pi)(Q_y - Q_-) is unbiased, and exactly 0 where pi(y) = 1."""
  task, model, examples, sample = setting
  exact, _ = _exact_and_mc(setting, k=1, seed=0)
  rb = rao_blackwell.rb_credit(
    model,
    task,
    sample.tokens,
    sample.mask,
    sample.token_valid,
    examples,
    jax.random.key(5),
    k=64,
    positions="all",
    logprobs=np.asarray(sample.logprobs),
  )
  mask = np.asarray(sample.mask)
  error = (np.asarray(rb.advantages) - np.asarray(exact.advantages))[mask]
  se = np.asarray(rb.adv_stderr)[mask]
  assert np.all(np.abs(error) <= 4.5 * se + 1e-6), np.max(np.abs(error) / np.maximum(se, 1e-9))
  informative = se > 1e-3
  # Agresti-Coull SEs are conservative near V = 0 or 1, so z^2 is bounded above, not pinned at 1;
  # the mean error is unbiased within its standard error.
  assert informative.sum() > 10 and np.mean((error[informative] / se[informative]) ** 2) < 2.0
  assert abs(error.mean()) <= 4 * np.sqrt(np.sum(se**2)) / len(se)
  assert np.abs(np.asarray(rb.advantages)[mask]).max() > 0.01  # not trivially zero
  assert rb.cost["rollouts"] == 2 * 64 * mask.sum()
  with pytest.raises(ValueError, match="needs the behaviour logprobs"):
    rao_blackwell.rb_credit(
      model, task, sample.tokens, sample.mask, sample.token_valid, examples, jax.random.key(5), k=2
    )


def test_rb_advantages_formula():
  adv, se = rao_blackwell.rb_advantages(
    jnp.array([0.9, 0.2]),
    jnp.array([0.4, 0.2]),
    jnp.array([0.75, 1.0]),
    jnp.array([0.3, 0.1]),
    jnp.array([0.4, 0.1]),
  )
  np.testing.assert_allclose(adv, [0.25 * 0.5, 0.0], atol=1e-7)
  np.testing.assert_allclose(se, [0.25 * 0.5, 0.0], atol=1e-7)


def test_exact_success_is_the_prompt_value_and_the_mean_sampled_reward(setting):
  """V(x) against brute-force enumeration, and against the mean reward of 2,048 sampled
  responses per prompt (within 4.5 standard errors)."""
  task, model, examples, sample = setting
  config = key_token.KeyTokenConfig(**OPTIONS)
  firsts, p = examples[::4], config.prompt_length  # the 4 distinct prompts
  prompts, targets = (np.stack([e[k] for e in firsts]) for k in ("prompt", "targets"))
  got = key_token.oracle.exact_success(model, config, prompts, targets)
  np.testing.assert_allclose(
    got, _brute_force_values(model, config, firsts, np.asarray(sample.tokens)[::4])[:, p], atol=1e-5
  )
  n = 2048
  drawn = generate(
    model,
    np.repeat(prompts, n, 0),
    np.ones((4 * n, p), bool),
    jax.random.key(7),
    max_new_tokens=config.length,
    actions=task.actions,
  )
  rewards = task.score(
    np.asarray(drawn.tokens)[:, p:],
    np.asarray(drawn.mask)[:, p:],
    [e for e in firsts for _ in range(n)],
  ).reshape(4, n)
  stderr = np.maximum(np.sqrt(got * (1 - got) / n), 1 / n)
  assert np.all(np.abs(rewards.mean(1) - got) < 4.5 * stderr), (rewards.mean(1), got)
  assert got.std() > 0.01  # the prompts differ: a per-prompt value, not one number


def test_decisive_distributions_are_the_enumerated_key_marginals_and_give_the_success(setting):
  """D[i, k, c] against enumeration in float64: the probability of key c at decisive position
  k among every allowed response whose earlier keys are right; under rule `all` the product of
  the right keys' probabilities is V(x)."""
  _, model, examples, _ = setting
  config = key_token.KeyTokenConfig(**OPTIONS)
  firsts, p = examples[::4], config.prompt_length
  prompts, targets = (np.stack([e[k] for e in firsts]) for k in ("prompt", "targets"))
  got = np.asarray(jax.jit(key_token.oracle.decisive_distributions, static_argnums=1)(
      model, config, prompts, targets), np.float64)
  allowed = key_token.allowed(config)
  responses = np.asarray(list(itertools.product(*[np.flatnonzero(a) for a in allowed])))
  decisive = responses[:, config.decisive_positions]
  for row, prompt in enumerate(prompts):
    rows = np.tile(prompt, (len(responses), 1))
    logp = _teacher_forced_logprobs(
      model,
      np.concatenate([rows, key_token.observe(responses, config)], 1),
      np.concatenate([np.ones((p, key_token.VOCAB_SIZE), bool), allowed]),
    )
    path = np.exp(np.take_along_axis(logp[:, p - 1 : -1], responses[..., None], 2)[..., 0].sum(1))
    for k in range(config.n_decisive):
      right_before = (decisive[:, :k] == targets[row, :k]).all(axis=1)
      want = [path[right_before & (decisive[:, k] == key)].sum() for key in config.keys]
      np.testing.assert_allclose(got[row, k], np.asarray(want) / path[right_before].sum(),
                                 atol=1e-5)
  np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
  right = np.take_along_axis(got, (targets - key_token.KEY0)[..., None], 2)[..., 0]
  np.testing.assert_allclose(right.prod(1), key_token.oracle.exact_success(
      model, config, prompts, targets), atol=1e-5)
  assert got.std() > 0.01
  with pytest.raises(ValueError, match="filler_blind"):
    key_token.oracle.decisive_distributions(model, key_token.KeyTokenConfig(), prompts, targets)
