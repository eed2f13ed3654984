"""Seeds vmapped inside one jit (lab.batched), the traceable exact oracle it uses, and the
oracle_shuffled control."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit import estimators
from jaxcredit.lab import arms, batched, cells, compute, diagnostics, update_batch
from jaxcredit.models import Transformer, flops, preset
from jaxcredit.credit import monte_carlo
from jaxcredit.tasks import key_token, procedural
from jaxcredit.testing import strategies

TASK = key_token.KeyTokenConfig(length=6, n_decisive=2, n_keys=3, n_fillers=2, filler_blind=True)
MODEL = preset("tiny", vocab_size=key_token.VOCAB_SIZE, n_layers=1, d_model=32, n_heads=2,
               n_kv_heads=2, d_ff=64)


def _shuffled_reference(credit, mask, priorities):
  """float64 loop: the i-th action in position order gets the credit of the action with the
  i-th smallest priority."""
  credit, mask = np.asarray(credit, np.float64), np.asarray(mask, bool)
  out = np.zeros(credit.shape)
  for row in range(len(credit)):
    actions = np.flatnonzero(mask[row])
    by_priority = actions[np.argsort(np.asarray(priorities)[row, actions], kind="stable")]
    out[row, actions] = credit[row, by_priority]
  return out


class OracleShuffledTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_against_a_float64_loop_and_keeps_each_responses_credit(self):
    rng = np.random.default_rng(0)
    for group_size in (1, 2, 4):
      rollout = strategies.make_rollout(rng, batch=8, length=9, group_size=group_size)
      shuffled = estimators.get("oracle_shuffled")
      got = np.asarray(self.variant(lambda r: shuffled(r).advantages)(rollout))
      mask = np.asarray(rollout.mask, bool)
      credit = np.where(mask, np.asarray(rollout.extras["oracle_advantages"]), 0.0)
      want = _shuffled_reference(credit, mask, rollout.extras["shuffle_priorities"])
      np.testing.assert_allclose(got, want, atol=1e-6)
      for row in range(8):  # a permutation of the row's own action credit
        np.testing.assert_allclose(np.sort(got[row][mask[row]]), np.sort(credit[row][mask[row]]),
                                   atol=1e-6)
      assert np.all(got[~mask] == 0)

  def test_over_draws_every_action_gets_the_mean_credit_of_its_response(self):
    rollout = strategies.make_rollout(np.random.default_rng(1), batch=4, length=7, group_size=1)
    keys = jax.random.split(jax.random.key(0), 4000)
    draw = jax.jit(jax.vmap(lambda k: estimators.get("oracle_shuffled")(rollout.replace(
        extras={**rollout.extras, "shuffle_priorities": jax.random.uniform(k, (4, 7))}))
        .advantages))
    mean = np.asarray(draw(keys), np.float64).mean(0)
    mask = np.asarray(rollout.mask, bool)
    credit = np.where(mask, np.asarray(rollout.extras["oracle_advantages"]), 0.0)
    for row in range(4):
      if mask[row].any():
        spread = credit[row][mask[row]]
        np.testing.assert_allclose(mean[row][mask[row]], spread.mean(),
                                   atol=5 * spread.std() / np.sqrt(4000) + 1e-5)


def test_the_exact_oracle_traces_under_vmap_over_policies():
  """decisive_values under jit and vmap over two policies equals each policy's host oracle
  (itself checked against brute-force enumeration in test_lab_oracle)."""
  symbols = np.array([[0, 1], [2, 2], [1, 0]])
  prompts, targets = key_token.traceable.prompts_of(symbols, TASK)
  graphdef, _ = nnx.split(Transformer(MODEL, rngs=nnx.Rngs(0)))
  states = [nnx.state(Transformer(MODEL, rngs=nnx.Rngs(seed))) for seed in (0, 1)]
  stacked = jax.tree.map(lambda *x: jnp.stack(x), *states)
  roots = jax.jit(jax.vmap(lambda s: key_token.oracle.decisive_values(
      nnx.merge(graphdef, s), TASK, prompts, targets)[0][:, 0]))(stacked)
  for seed, state in enumerate(states):
    host = key_token.oracle.exact_success(nnx.merge(graphdef, state), TASK, np.asarray(prompts),
                                          np.asarray(targets))
    np.testing.assert_allclose(np.asarray(roots[seed]), host, atol=1e-6)


@pytest.mark.parametrize("key_fn", ["copy", "shift"])
def test_prompts_are_laid_out_as_the_task_builds_them(key_fn):
  config = key_token.KeyTokenConfig(n_decisive=3, n_keys=5, key_fn=key_fn)
  rng = np.random.default_rng(0)
  for _ in range(20):
    example = key_token.make_example(rng, config)
    prompt, targets = key_token.traceable.prompts_of(example["prompt"][1:-1] - key_token.KEY0,
                                                     config)
    np.testing.assert_array_equal(prompt, example["prompt"])
    np.testing.assert_array_equal(targets, example["targets"])


def _sampling_and_step_flops(cell) -> float:
  """Model FLOPs of one update's sampling (a causal pass with the drawn tokens' logits) and
  gradient step (3 such passes), from models.flops."""
  rows = cell.prompts_per_step * cell.group_size
  return 4.0 * rows * flops.sampling_flops(cell.model, TASK.prompt_length, TASK.length)


def _fixed_flops(cell, result, runs) -> np.ndarray:
  """[runs, evaluations] charged FLOPs from `compute.fixed_update_flops` (the charge of cells
  run before runs recorded it): the updates so far times each run's arm's per-update FLOPs."""
  per_update = [compute.fixed_update_flops(cell, cell.arms[arm]) for arm, _, _ in runs]
  return np.outer(per_update, result["updates"])


def _cell(*arms, **changes):
  settings = dict(task=TASK, model=MODEL, arms=tuple({"scale": "rms", "of": a} for a in arms),
                  group_size=4, prompts_per_step=3, updates=6, eval_every=3)
  return cells.Cell(**{**settings, **changes})


def _sampler(cell, *, needs=frozenset(arms.EXTRAS), oracle_extras=False):
  """``sample(model, key, mc=arms.MonteCarlo())``: `update_batch.make_rollout(cell, needs)`
  compiled once (the rollout is traceable: eagerly, each of its operations would compile on
  its own), the Monte-Carlo settings traced, as a cell's program traces them, so that other
  settings reuse the program."""
  rollout = nnx.jit(lambda model, key, mc: update_batch.make_rollout(cell, needs)(
      model, key, oracle_extras, mc))
  return lambda model, key, mc=arms.MonteCarlo(): rollout(
      model, key, arms.MonteCarlo(*(jnp.asarray(field) for field in mc)))


def _sampled(cell, model, key, **options):
  """A batch of `_sampler(cell, **options)`."""
  return _sampler(cell, **options)(model, key)


def test_vmapped_runs_equal_their_runs_alone_and_start_at_the_policys_exact_success():
  """Runs of two arms, two learning rates and two seeds in one program: each equals the
  same run among other company (reordered, padded with copies), starts at its policy's
  exact J, and follows its own arm and learning rate."""
  cell = _cell("grpo", "oracle", mechanism_batches=2)
  runner = batched.Runner(cell)
  runs = [(arm, rate, seed) for arm in (0, 1) for rate in (1e-3, 1e-2) for seed in (3, 5)]
  grid = runner.train(runs)
  alone = runner.train([runs[-1], runs[0]], width=len(runs))  # padded with copies of runs[0]
  for key in ("success", "reward_mean", "zero_variance_groups", "grad_norm", "filler_entropy",
              *diagnostics.MECHANISM):
    np.testing.assert_allclose(grid[key][[-1, 0]], alone[key], rtol=1e-5, atol=1e-6)
  assert grid["success"].shape == (8, 3)
  np.testing.assert_array_equal(grid["gen_tokens"], [[0, 216, 432]] * 8)  # T tokens a response
  assert grid["compile_seconds"] > 0 and alone["compile_seconds"] == 0  # the same program
  # Same seed: the same first batch whatever the arm and rate; then they part.
  first = grid["reward_mean"][:, 0].reshape(4, 2)
  np.testing.assert_array_equal(first, np.broadcast_to(first[:1], first.shape))
  finals = grid["success"][:, -1].reshape(2, 2, 2)
  assert np.all(finals[0] != finals[1]) and np.all(finals[:, 0] != finals[:, 1])
  # Before any update: the exact J of the freshly initialised policy of that seed.
  symbols = procedural.evaluation_symbols(TASK.n_keys, TASK.n_decisive, cell.eval_prompts)
  assert len(symbols) == 9  # every prompt of |C|^K = 9
  prompts, targets = key_token.traceable.prompts_of(symbols, TASK)
  for row, seed in enumerate((3, 5)):
    start = key_token.oracle.exact_success(Transformer(MODEL, rngs=nnx.Rngs(seed)), TASK,
                                           np.asarray(prompts), np.asarray(targets))
    np.testing.assert_allclose(grid["success"][row, 0], start.mean(), atol=1e-6)
    for k in cell.pass_at:
      np.testing.assert_allclose(grid["pass@k"][k][row, 0], np.mean(1 - (1 - start) ** k),
                                 atol=1e-6)
  # After the last update, each prompt's keys (rule `all`): the right keys' probabilities
  # multiply to its value, whose mean is the last J.
  assert grid["final_keys"].shape == (8, 9, TASK.n_decisive, TASK.n_keys)
  np.testing.assert_allclose(grid["final_keys"][[-1, 0]], alone["final_keys"], rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_array_equal(grid["key_targets"],
                                np.broadcast_to(np.asarray(targets) - key_token.KEY0, (8, 9, 2)))
  right = np.take_along_axis(grid["final_keys"], grid["key_targets"][..., None], -1)[..., 0]
  np.testing.assert_allclose(right.prod(-1).mean(-1), grid["success"][:, -1], atol=1e-5)
  # The gradient measurements: the exact credit's gradient is its own (cosine 1) and has
  # no filler part; GRPO's has one and points elsewhere.
  oracle_runs, grpo_runs = slice(4, 8), slice(0, 4)
  np.testing.assert_allclose(grid["cosine_to_exact"][oracle_runs], 1.0, atol=1e-5)
  np.testing.assert_allclose(grid["filler_norm"][oracle_runs], 0.0, atol=1e-7)
  # (2 batches whose groups all have equal rewards give GRPO no gradient: 0, not NaN.)
  assert np.all(np.any(grid["filler_norm"][grpo_runs] > 0, axis=1))
  assert np.all(np.abs(grid["cosine_to_exact"][grpo_runs]) < 0.999)
  assert np.all((grid["signal_fraction"] >= 0) & (grid["signal_fraction"] <= 1 + 1e-6))
  # (A batch whose groups all have equal rewards gives GRPO no gradient.)
  assert np.all(np.isfinite(grid["grad_norm"])) and np.all(np.any(grid["grad_norm"] > 0, axis=1))
  # Credit on filler: none for the exact credit; GRPO's broadcast puts weight 1 on each of
  # the T - K = 4 fillers (0 for a batch without credit).
  np.testing.assert_allclose(grid["noisy_tokens"][oracle_runs], 0.0, atol=1e-6)
  # The exact credit is a function of (state, token): sharing leaves it as it is.
  np.testing.assert_allclose(grid["credit_cosine"][oracle_runs], 1.0, atol=1e-5)
  np.testing.assert_allclose(grid["implicit_credit_cosine"][oracle_runs], 1.0, atol=1e-5)
  assert set(np.round(grid["noisy_tokens"][grpo_runs].ravel(), 5)) <= {0.0, 4.0}
  # Measured at chosen evaluations only: the same numbers there, nothing else changed.
  chosen = batched.Runner(dataclasses.replace(cell, mechanism_evals=(0, 2))).train(runs)
  for key in diagnostics.MECHANISM:
    np.testing.assert_allclose(chosen[key], grid[key][:, [0, 2]], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(chosen["success"], grid["success"], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(chosen["mechanism_gen_tokens"], [[0, 432]] * 8)


def test_with_visible_filler_runs_use_e_tree_and_filler_carries_exact_credit():
  visible = dataclasses.replace(TASK, filler_blind=False)
  result = batched.Runner(_cell("grpo", "oracle", task=visible, mechanism_batches=1)).train(
      [(0, 1e-2, 3), (1, 1e-2, 3)])
  symbols = procedural.evaluation_symbols(visible.n_keys, visible.n_decisive, 256)
  prompts, targets = key_token.traceable.prompts_of(symbols, visible)
  roots = key_token.oracle.value_tree(Transformer(MODEL, rngs=nnx.Rngs(3)), visible, prompts,
                                      targets)[0]
  np.testing.assert_allclose(result["success"][:, 0], np.mean(roots), atol=1e-6)
  # The exact credit's own gradient and credit; a function of (state, token) with every
  # earlier token in the state, so sharing leaves it as it is; and some of it on filler.
  for key in ("cosine_to_exact", "credit_cosine", "implicit_credit_cosine"):
    np.testing.assert_allclose(result[key][1], 1.0, atol=1e-5)
  assert result["noisy_tokens"][1].max() > 0 and np.all(result["filler_norm"][1] > 0)


def test_noisy_tokens_against_a_float64_loop():
  rng = np.random.default_rng(0)
  advantages = rng.normal(size=(6, 9)) * (rng.uniform(size=(6, 9)) < 0.7)
  mask = rng.uniform(size=(6, 9)) < 0.8
  advantages[2], mask[4] = 0.0, False  # a row without credit, a row without tokens
  decisive = rng.uniform(size=9) < 0.3
  rows = []
  for a, m in zip(advantages, mask):
    weight = np.where(m, np.abs(a), 0.0)
    if weight.max() > 0:
      rows.append(sum(weight[t] / weight.max() for t in range(9) if not decisive[t]))
  for fn in (diagnostics.noisy_tokens, jax.jit(diagnostics.noisy_tokens)):
    np.testing.assert_allclose(fn(jnp.asarray(advantages, jnp.float32), mask, decisive),
                               np.mean(rows), rtol=1e-5)
  assert diagnostics.noisy_tokens(jnp.zeros((2, 3)), jnp.ones((2, 3), bool), decisive[:3]) == 0.0


def test_implicit_credit_against_a_loop_over_shared_states():
  """Row i's credit at t: the mean over rows j of its group with the same token at t and
  the same decisive tokens before t."""
  rng = np.random.default_rng(0)
  group, length = 4, 7
  tokens = rng.integers(0, 2, (3 * group, length))
  credit = rng.normal(size=tokens.shape)
  decisive = np.zeros(length, bool)
  decisive[[2, 5]] = True
  expected = np.zeros_like(credit)
  for i in range(len(tokens)):
    for t in range(length):
      same = [j for j in range(i // group * group, (i // group + 1) * group)
              if tokens[j, t] == tokens[i, t]
              and all(tokens[j, d] == tokens[i, d] for d in range(t) if decisive[d])]
      expected[i, t] = credit[same, t].mean()
  got = jax.jit(diagnostics.implicit_credit, static_argnums=3)(jnp.asarray(credit, jnp.float32),
                                                          tokens, decisive, group)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(diagnostics.implicit_credit(credit, tokens, decisive, 1), credit)


def test_evaluations_at_given_updates_equal_the_regular_ones_there():
  """eval_at measures J (and the gradients) before the updates it names: at 0, 3 it is the
  eval_every = 3 run; at log-spaced updates each measurement is the state after those
  updates, and the updates themselves do not change."""
  # The runs and cell of the vmapped test above: the process keeps its compiled program.
  runs = [(arm, rate, seed) for arm in (0, 1) for rate in (1e-3, 1e-2) for seed in (3, 5)]
  regular = batched.Runner(_cell("grpo", "oracle", mechanism_batches=2)).train(runs)
  named = batched.Runner(_cell("grpo", "oracle", mechanism_batches=2, eval_at=(0, 3))).train(runs)
  for key in ("success", "gen_tokens", "updates", "reward_mean", "grad_norm",
              *diagnostics.MECHANISM):
    np.testing.assert_allclose(named[key], regular[key], rtol=1e-5, atol=1e-6, err_msg=key)
  spaced = batched.Runner(_cell("grpo", "oracle", eval_at=(0, 1, 2, 4))).train(runs)
  np.testing.assert_array_equal(spaced["updates"], [0, 1, 2, 4, 6])
  np.testing.assert_array_equal(spaced["gen_tokens"], [[0, 72, 144, 288, 432]] * len(runs))
  np.testing.assert_allclose(spaced["reward_mean"], regular["reward_mean"], rtol=1e-5)
  np.testing.assert_allclose(spaced["success"][:, [0, -1]], regular["success"][:, [0, -1]],
                             rtol=1e-5, atol=1e-6)
  for bad in ((), (1, 2), (0, 3, 3), (0, 6)):
    with pytest.raises(ValueError, match="eval_at must be increasing updates from 0"):
      _cell("grpo", eval_at=bad)


def test_a_warm_start_sets_the_regime_confident_filler_and_a_starting_success():
  """SFT on demonstrations with filler F0 99% of the time and the right keys half the time:
  the filler entropy falls far below a fresh policy's, and J starts near the
  demonstrations' success (1/2 + 1/2 * 1/3 per key, two keys: 0.44), not at chance (1/9)."""
  warmup = cells.Warmup(steps=150, filler_probs=(0.99, 0.01), key_accuracy=0.5)
  result = batched.Runner(_cell("grpo", warmup=warmup)).train([(0, 1e-3, 0), (0, 1e-3, 1)])
  assert np.all(result["filler_entropy"][:, 0] < 0.15), result["filler_entropy"][:, 0]
  assert np.all(np.abs(result["success"][:, 0] - (2 / 3) ** 2) < 0.08), result["success"][:, 0]
  # starting_policy is that start: its exact J is the run's first evaluation.
  cell = _cell("grpo", warmup=warmup)
  config, task = cell.task, update_batch.traceable_task(cell)
  start = key_token.oracle.decisive_values(batched.starting_policy(cell, 1), config,
                                           *task.eval_prompts)[0][:, 0].mean()
  np.testing.assert_allclose(start, result["success"][1, 0], atol=1e-5)


def test_bad_cells_and_runs_are_refused_naming_the_problem():
  with pytest.raises(ValueError, match="multiple of eval_every"):
    _cell("grpo", updates=7)
  with pytest.raises(ValueError, match="key_token must be constrained"):
    _cell("grpo", task=key_token.KeyTokenConfig(constrained=False))
  with pytest.raises(ValueError, match=r"E-TREE\) runs 1,073,741,824 paths per prompt, over 4,096"):
    _cell("grpo", task=key_token.KeyTokenConfig(length=24, n_fillers=4))
  with pytest.raises(ValueError, match="needs baseline_rewards too"):
    batched.make_run(_cell("grpo", "remax"))
  with pytest.raises(ValueError, match="warmup.filler_probs must be 2 probabilities"):
    _cell("grpo", warmup=cells.Warmup(steps=1, filler_probs=(0.5, 0.4)))
  with pytest.raises(ValueError, match=r"warmup.key_accuracy must be in \[0, 1\], got 1.5"):
    cells.Warmup(steps=1, filler_probs=(0.5, 0.5), key_accuracy=1.5)
  for evals in ((), (1, 0), (0, 3)):
    with pytest.raises(ValueError, match=r"mechanism_evals must be increasing evaluation "
                                         r"indices in \[0, 3\)"):
      _cell("grpo", mechanism_batches=1, mechanism_evals=evals)
  with pytest.raises(ValueError, match=r"arm index in \[0, 1\)"):
    batched.Runner(_cell("grpo")).train([(1, 1e-3, 0)])


def test_a_target_sum_batch_carries_its_rule_reward_and_e_tree_credit():
  """make_rollout on target_sum: rewards are the task's rule, the oracle extras equal
  target_sum.oracle.tree_credit on the same rows (the host entry point, tested against
  enumeration)."""
  from jaxcredit.tasks import target_sum

  task = target_sum.TargetSumConfig(n_digits=3, n_values=3, target_low=1, target_high=5)
  model = Transformer(dataclasses.replace(MODEL, vocab_size=target_sum.VOCAB_SIZE),
                      rngs=nnx.Rngs(0))
  cell = _cell("oracle", task=task, model=model.config, prompts_per_step=4)
  batch = _sampled(cell, model, jax.random.key(2))
  tokens, mask = np.asarray(batch.tokens), np.asarray(batch.mask)
  targets = (tokens[:, 2] - target_sum.DIGIT0) * 10 + tokens[:, 3] - target_sum.DIGIT0
  response = np.where(mask[:, 5:], tokens[:, 5:], target_sum.PAD)
  np.testing.assert_array_equal(batch.rewards, target_sum.reward(response, targets, task))
  exact = target_sum.oracle.tree_credit(model, task, tokens, mask, targets)
  np.testing.assert_allclose(batch.extras["oracle_advantages"], exact.advantages, atol=1e-6)
  np.testing.assert_allclose(batch.extras["oracle_values"], exact.values, atol=1e-6)
  assert (mask[:, 5:].sum(1) < 4).any()  # some responses stop before n digits
  with pytest.raises(ValueError, match="target_sum cells run without a warmup"):
    _cell("grpo", task=task, model=model.config, mechanism_batches=2)


def test_a_learnt_lambda_grpo_arm_steps_its_preference_as_the_trainers_provider_does():
  """lambda_grpo_learned in a batched cell (target_sum: lengths differ): a batch's length
  weights and lam's Adam step equal the trainer's provider on the same batch (its runs train
  and log lam: tests/studies/test_length_bias.py); a cell's learnt arms share one
  preference."""
  from jaxcredit.credit import length_preference
  from jaxcredit.tasks import target_sum

  task = target_sum.TargetSumConfig(n_digits=3, n_values=3, target_low=1, target_high=5)
  model = Transformer(dataclasses.replace(MODEL, vocab_size=target_sum.VOCAB_SIZE),
                      rngs=nnx.Rngs(0))
  learnt = {"name": "lambda_grpo_learned", "lam": 0.5, "r": 1.0, "lam_learning_rate": 0.1}
  cell = _cell("grpo", task=task, model=model.config, prompts_per_step=4)
  cell = dataclasses.replace(cell, arms=(*cell.arms, {"scale": "rms", "of": learnt}))
  assert arms.length_preference(cell) == {"lam": 0.5, "r": 1.0, "learning_rate": 0.1}
  modules = arms.modules(model, cell, 1e-3)
  actions = update_batch.traceable_task(cell).actions
  batch = _sampled(cell, model, jax.random.key(3))
  assert len(set(np.asarray(batch.mask).sum(1).tolist())) > 1
  host = length_preference.LengthPreferenceProvider(0.5, 1.0, 0.1)
  extras, metrics = host(None, batch)
  scored = update_batch.with_models(modules, batch, actions)  # no step: lam stays 0.5
  np.testing.assert_allclose(scored.extras["length_weights"], extras["length_weights"],
                             rtol=1e-6)
  assert float(modules["length_preference"].lam[...]) == metrics["lambda_grpo/lam"] == 0.5
  stepped = update_batch.with_models(modules, batch, actions, learn=True)
  np.testing.assert_allclose(stepped.extras["length_weights"], extras["length_weights"],
                             rtol=1e-6)
  np.testing.assert_allclose(modules["length_preference"].lam[...],
                             host.modules()["length_preference"].lam[...], rtol=1e-6)
  assert float(modules["length_preference"].lam[...]) != 0.5
  with pytest.raises(ValueError, match="must share"):
    arms.length_preference(dataclasses.replace(cell, arms=(learnt, {**learnt, "lam": 1.0})))


def test_a_ktae_arm_reads_its_groups_token_statistics():
  """KTAE in a batched cell: the batch's key-token scores (with the TF term) equal the
  float64 reference on its tokens and rewards (its runs train: the PRIME test below)."""
  from tests.unit.credit.test_credit_methods import _ktae_reference

  cell = _cell("grpo", "ktae")
  model = Transformer(MODEL, rngs=nnx.Rngs(0))
  batch = _sampled(cell, model, jax.random.key(4), needs=frozenset({"ktae_scores"}))
  tokens, mask, rewards = (np.asarray(x) for x in (batch.tokens, batch.mask, batch.rewards))
  assert 0 < rewards.mean() < 1
  np.testing.assert_allclose(batch.extras["ktae_scores"],
                             _ktae_reference(tokens, mask, rewards, cell.group_size), atol=2e-5)


def test_a_prime_arm_scores_and_trains_its_prm_as_the_trainers_implicit_prm_does():
  """PRIME in a batched cell: the PRM and the reference start as the policy; a batch's PRM
  log-probs, the PRM's loss and its step equal the trainer's ImplicitPRM on the same batch;
  its runs train."""
  import types

  from jaxcredit.credit import implicit_prm

  cell, prm_rate = _cell("grpo", "prime"), 3e-3  # the arm's rate reaches the PRM's Adam
  model = Transformer(MODEL, rngs=nnx.Rngs(0))
  modules = arms.modules(model, cell, 1e-3, prm_learning_rate=prm_rate)
  actions = update_batch.traceable_task(cell).actions
  batch = _sampled(cell, model, jax.random.key(4))
  scored = update_batch.with_models(modules, batch, actions)
  sampled = np.where(batch.mask, batch.behaviour_logprobs, 0.0)
  np.testing.assert_allclose(scored.ref_logprobs, sampled, atol=1e-5)
  np.testing.assert_allclose(scored.extras["prm_logprobs"], sampled, atol=1e-5)
  host = implicit_prm.ImplicitPRM(beta=0.05, learning_rate=prm_rate)
  extras, metrics = host(types.SimpleNamespace(actions=actions), model, scored)
  loss, logprobs = implicit_prm.update(modules["prm"], modules["prm_optimizer"], scored,
                                       actions, arms.prm_beta(cell), 1.0)
  np.testing.assert_allclose(logprobs, extras["prm_logprobs"], atol=1e-6)
  assert float(loss) == pytest.approx(metrics["prm_loss"], rel=1e-5)
  chex.assert_trees_all_close(nnx.state(modules["prm"], nnx.Param),
                              nnx.state(host.prm, nnx.Param), atol=1e-6)
  assert not np.allclose(update_batch.with_models(modules, batch, actions).extras["prm_logprobs"],
                         sampled, atol=1e-5)  # the PRM moved, the reference did not
  # As a run scores and steps (with_models with prm_beta): the same log-probs and step.
  stepped = arms.modules(model, cell, 1e-3, prm_learning_rate=prm_rate)
  trained = update_batch.with_models(stepped, batch, actions, prm_beta=arms.prm_beta(cell))
  np.testing.assert_allclose(trained.extras["prm_logprobs"], extras["prm_logprobs"], atol=1e-6)
  np.testing.assert_allclose(trained.ref_logprobs, scored.ref_logprobs, atol=1e-6)
  chex.assert_trees_all_close(nnx.state(stepped["prm"], nnx.Param),
                              nnx.state(host.prm, nnx.Param), atol=1e-6)
  # Both arms that read statistics or a second model train, in one program.
  charged_cell, runs = _cell("grpo", "ktae", "prime"), [(1, 1e-2, 0), (2, 1e-2, 0)]
  out = batched.Runner(charged_cell).train(runs)
  assert np.all(np.isfinite(out["success"])) and np.all(np.any(out["grad_norm"] > 0, axis=1))
  assert not np.allclose(out["grad_norm"][0], out["grad_norm"][1])
  # PRIME is charged its PRM's step and the reference's pass (4 policy passes) beside
  # sampling and its own step; KTAE's statistics are free.
  per_update = _sampling_and_step_flops(_cell())
  np.testing.assert_allclose(out["charged_flops"], [[0, 3 * per_update, 6 * per_update],
                                                    [0, 6 * per_update, 12 * per_update]],
                             rtol=1e-5)
  np.testing.assert_allclose(out["charged_flops"], _fixed_flops(charged_cell, out, runs),
                             rtol=1e-5)
  with pytest.raises(ValueError, match="must share beta"):
    arms.prm_beta(_cell("prime", {"name": "prime", "beta": 0.1}))
  # Each arm's PRM learns at its own rate: at rate 0 the PRM stays the reference, the
  # implicit rewards are 0 and PRIME is RLOO run for run (the PRM and the reference change
  # nothing else); at 1e-2 it is not.
  rated = dataclasses.replace(_cell(), arms=tuple({"scale": "rms", "of": name} for name in (
      "rloo", "prime", "prime")), prm_learning_rates=(None, 0.0, 1e-2))
  assert arms.prm_learning_rates(rated) == (arms.PRM_LEARNING_RATE, 0.0, 1e-2)
  plain = batched.Runner(rated).train([(0, 1e-2, 0), (1, 1e-2, 0), (2, 1e-2, 0)])
  np.testing.assert_allclose(plain["success"][0], plain["success"][1], atol=1e-6)
  np.testing.assert_allclose(plain["grad_norm"][0], plain["grad_norm"][1], rtol=1e-4, atol=1e-8)
  assert not np.allclose(plain["grad_norm"][0], plain["grad_norm"][2], rtol=1e-3)
  with pytest.raises(ValueError, match="one rate \\(or None\\) per arm: 2 for 3 arms"):
    dataclasses.replace(rated, prm_learning_rates=(None, 0.0))


def test_monte_carlo_arms_draw_what_real_continuations_give_and_are_charged_for_them(tmp_path):
  """A Monte-Carlo arm's values (k continuations from every action's state, drawn as
  Binomial(k, V) / k) against real continuations of the same batch (`monte_carlo.mc_credit`):
  both scatter around the exact V with variance V (1 - V) / k, and the charge is the
  tokens the real continuations generate; an arm evaluating every third action (VinePPO at
  a stride) or SPO's cutpoints draws and is charged at those states only."""
  import ml_collections

  from jaxcredit import tasks

  k = 8
  options = {f.name: getattr(TASK, f.name) for f in dataclasses.fields(TASK)}
  task = tasks.make(ml_collections.ConfigDict({"name": "key_token", "options": options,
                                               "train_size": 8, "test_size": 4}),
                    data_dir=str(tmp_path), seed=0)
  model = Transformer(MODEL, rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)  # peaked conditionals: values spread over (0, 1)
  nnx.update(model, jax.tree.map(lambda x: 3 * x, state))
  mc_arm = {"name": "vineppo", "k": k, "positions": "all"}
  strided_arm = {"name": "vineppo", "k": k, "positions": "stride:3"}
  cell = _cell("grpo", mc_arm, strided_arm, prompts_per_step=16)
  sample = _sampler(cell)
  batch = sample(model, jax.random.key(4), mc=arms.MonteCarlo(k))
  mask, values = np.asarray(batch.mask), np.asarray(batch.extras["oracle_values"])
  drawn = np.asarray(batch.extras["mc_values"])
  np.testing.assert_array_equal(batch.extras["mc_evaluated"], mask)
  assert np.all(drawn[~mask] == 0) and np.allclose(drawn * k, np.round(drawn * k))
  prompt_len = TASK.prompt_length
  tokens = np.asarray(batch.tokens)
  examples = [{"prompt": row[:prompt_len], "targets": row[1:prompt_len - 1]} for row in tokens]
  real = monte_carlo.mc_credit(model, task, tokens, mask, batch.token_valid, examples,
                               jax.random.key(5), k=k, positions="all")
  spread = np.sqrt(values * (1 - values) / k)[mask]
  inner = spread > 0.02
  for name, estimate in (("drawn", drawn), ("real", np.asarray(real.values))):
    z = ((estimate[mask] - values[mask]) / np.maximum(spread, 1e-6))[inner]
    assert 0.6 < np.mean(z**2) < 1.5, (name, np.mean(z**2))
    assert abs(np.mean(z)) < 4 / np.sqrt(len(z)), (name, np.mean(z))
  assert inner.sum() > 100
  charged = arms.continuation_tokens(batch.mask, k, TASK.length)
  assert charged == real.cost["gen_tokens"] == k * mask.sum(0)[prompt_len:] @ np.arange(6, 0, -1)
  # At a stride or at cutpoints: the same draws at the evaluated states (the trainer's
  # select_positions), 0 elsewhere, and the real continuations' tokens from those states.
  for arm, logprobs in ((strided_arm, None), ({"name": "spo", "k": k}, batch.behaviour_logprobs)):
    rule = arms.monte_carlo(estimators.from_config(arm))
    spec = arm.get("positions", "cutpoints:0.9")
    at = sample(model, jax.random.key(4), mc=rule)
    evaluated = np.asarray(monte_carlo.select_positions(mask, logprobs, spec))
    assert 0 < evaluated.sum() < mask.sum()
    np.testing.assert_array_equal(at.extras["mc_evaluated"], evaluated)
    np.testing.assert_array_equal(at.extras["mc_values"], np.where(evaluated, drawn, 0.0))
    real = monte_carlo.mc_credit(model, task, tokens, mask, batch.token_valid, examples,
                                 jax.random.key(5), k=k, positions=spec,
                                 logprobs=np.asarray(batch.behaviour_logprobs))
    np.testing.assert_array_equal(real.evaluated, evaluated)
    assert arms.continuation_tokens(evaluated, k, TASK.length) == real.cost["gen_tokens"]
  # In a run: the arm's credit telescopes to R - V_hat(x); only it is charged, per update
  # k T (T + 1) / 2 tokens per response beside its T at every action, k (T + (T - 3)) at
  # every third.
  runs = [(0, 1e-2, 3), (1, 1e-2, 3), (2, 1e-2, 3)]
  result = batched.Runner(cell).train(runs)
  rows = cell.prompts_per_step * cell.group_size
  np.testing.assert_array_equal(result["charged_tokens"][0], result["gen_tokens"][0])
  np.testing.assert_array_equal(result["charged_tokens"][1],
                                result["gen_tokens"][1] * (1 + k * (TASK.length + 1) / 2))
  np.testing.assert_array_equal(result["charged_tokens"][2],
                                result["gen_tokens"][2] * (1 + k * (2 * TASK.length - 3) / 6))
  assert result["gen_tokens"][1, -1] == cell.updates * rows * TASK.length
  # FLOPs: K continuations from the state at slot t generate slots t..T-1 (slot j attends to
  # P + j + 1 keys), their prefix cached.
  slots = [flops.token_flops(cell.model, TASK.prompt_length + j + 1) for j in range(TASK.length)]
  continuations = k * rows * sum((j + 1) * slots[j] for j in range(TASK.length))
  strided = k * rows * sum(sum(slots[t:]) for t in range(0, TASK.length, 3))
  per_update = _sampling_and_step_flops(cell)
  updates = result["updates"]
  np.testing.assert_allclose(result["charged_flops"][0], updates * per_update, rtol=1e-5)
  np.testing.assert_allclose(result["charged_flops"][1], updates * (per_update + continuations),
                             rtol=1e-5)
  np.testing.assert_allclose(result["charged_flops"][2], updates * (per_update + strided),
                             rtol=1e-5)
  # At every action and at a stride the charge does not depend on the samples; at cutpoints
  # it does.
  np.testing.assert_allclose(result["charged_flops"], _fixed_flops(cell, result, runs),
                             rtol=1e-5)
  cutpoints = {"name": "vineppo", "k": k, "positions": "cutpoints:0.9"}
  assert compute.fixed_update_flops(_cell("grpo", cutpoints), cutpoints) is None
  credit = estimators.from_config(mc_arm)(batch).advantages
  first = np.asarray(drawn)[:, prompt_len]
  np.testing.assert_allclose(np.sum(credit, axis=1), np.asarray(batch.rewards) - first,
                             atol=1e-5)
  for positions in ("stride:0", "every"):
    with pytest.raises(ValueError, match="positions"):
      _cell({"name": "vineppo", "k": 4, "positions": positions})


def test_a_critic_arm_trains_its_critic_and_ranks_alternatives_against_the_exact_values():
  """ppo_gae (GAE over a learned critic) in a batched cell: every run trains a critic
  started from its policy; at the measurements, the critic's and Monte-Carlo rankings of
  the alternative keys at each decisive position are scored against the exact values,
  which equal the host oracle's on the same responses with the key changed, and the
  critic's values of those states equal the learner's critic_values."""
  from jaxcredit import forward

  ppo_gae = {"name": "gae", "lam": 0.95}
  cell = _cell("grpo", ppo_gae, mechanism_batches=1)
  assert arms.has_critic(cell) and not arms.has_critic(_cell("grpo", "oracle"))
  runs = [(0, 1e-2, 3), (1, 1e-2, 3), (1, 3e-3, 4)]
  result = batched.Runner(cell).train(runs)
  np.testing.assert_allclose(result["charged_flops"], _fixed_flops(cell, result, runs),
                             rtol=1e-5)
  # Only the arm that reads the critic is charged for it: its values and its step, 4 passes
  # without logits.
  rows = cell.prompts_per_step * cell.group_size
  critic_flops = 4.0 * rows * flops.sequence_flops(
      MODEL, TASK.prompt_length + TASK.length, logits=False)
  per_update = _sampling_and_step_flops(cell)
  np.testing.assert_allclose(result["charged_flops"], np.outer(
      [1, 1 + critic_flops / per_update, 1 + critic_flops / per_update],
      result["updates"] * per_update), rtol=1e-5)
  for name in diagnostics.RANKING:
    assert result[name].shape == (3, 3) and np.all((result[name] >= 0) & (result[name] <= 1))
  assert np.all(result["grad_norm"][1:].max(axis=1) > 0)
  # Against the host oracle and the learner's critic on one batch.
  model = Transformer(MODEL, rngs=nnx.Rngs(0))
  nnx.update(model, jax.tree.map(lambda x: 3 * x, nnx.state(model, nnx.Param)))
  critic = arms.critic(cell, model, 0)
  batch = _sampled(cell, model, jax.random.key(1))
  tokens, p = np.asarray(batch.tokens), TASK.prompt_length
  symbols = tokens[::cell.group_size, 1:3] - key_token.KEY0
  prompts, targets = key_token.traceable.prompts_of(symbols, TASK)
  tree = key_token.oracle.decisive_values(model, TASK, prompts, targets)
  exact = np.asarray(diagnostics.alternative_values(tree, batch.tokens, TASK, cell.group_size))
  actions = update_batch.traceable_task(cell).actions
  scores = np.asarray(diagnostics.critic_alternatives(critic, batch, TASK, actions))
  row_targets = np.repeat(np.asarray(targets), cell.group_size, axis=0)
  for k, position in enumerate(TASK.decisive_positions):
    for c in range(TASK.n_keys):
      changed = tokens.copy()
      changed[:, p + position] = key_token.KEY0 + c
      host = key_token.oracle.decisive_credit(model, TASK, changed, batch.mask, row_targets)
      np.testing.assert_allclose(exact[:, k, c], np.asarray(host.values)[:, p + position + 1],
                                 atol=1e-6)
      learner_values = forward.critic_values(critic, batch.replace(tokens=jnp.asarray(changed)),
                                           update_batch.traceable_task(cell).actions)
      np.testing.assert_allclose(scores[:, k, c], learner_values[:, p + position + 1], atol=1e-6)
  # top-1 agreement against a loop; a random order scores the share of exact maxima; many
  # continuations rank distinct values right.
  rng = np.random.default_rng(0)
  values = rng.integers(0, 3, (50, 2, 3)) / 2.0
  guesses = rng.normal(size=values.shape)
  want = np.mean([values[i, k, np.argmax(guesses[i, k])] == values[i, k].max()
                  for i in range(50) for k in range(2)])
  np.testing.assert_allclose(diagnostics.top1_agreement(guesses, values), want)
  ranks = diagnostics.ranking(guesses, values, jax.random.key(0))
  np.testing.assert_allclose(ranks["random_top1"], np.mean(values == values.max(-1, keepdims=True)))
  distinct = np.broadcast_to([0.05, 0.5, 0.95], (200, 1, 3))
  ranks = diagnostics.ranking(np.zeros((200, 1, 3)), distinct, jax.random.key(1))
  assert ranks["critic_top1"] == 0.0 and ranks["mc64_top1"] == 1.0 and ranks["mc1_top1"] < 0.9


def test_a_zipf_explain_batch_carries_the_monte_carlo_oracles_credit():
  """zipf_explain in a batched cell: the batch's oracle credit is zipf_explain.oracle's at the
  response's cuts with the rollout's key (it telescopes to R - V-hat(s_0) in every row);
  J(pi) at an evaluation is the mean of the prompts' V-hat(s_0); the task's
  demonstrations follow the warmup's key accuracy; measurements are refused."""
  from jaxcredit.tasks import zipf_explain

  task = zipf_explain.ZipfExplainConfig(length=8, n_answers=2, n_keys=2, n_words=4, branching=3)
  model_config = dataclasses.replace(MODEL, vocab_size=zipf_explain.VOCAB_SIZE)
  cell = _cell("grpo", "oracle", task=task, model=model_config)
  model = Transformer(model_config, rngs=nnx.Rngs(0))
  batch = _sampled(cell, model, jax.random.key(5), oracle_extras=True)
  adapter = update_batch.traceable_task(cell)
  tokens, mask = np.asarray(batch.tokens), np.asarray(batch.mask)
  targets = tokens[:, 1:3] - zipf_explain.KEY0
  key = jax.random.fold_in(jax.random.key(5), update_batch.ORACLE_STREAM)
  cuts = zipf_explain.oracle.cuts_of(batch.tokens[:, task.prompt_length:], task, adapter.CUT_STRIDE)
  values, _ = zipf_explain.oracle.rb_values(model, tokens, targets, cuts, key, task,
                                            n_paths=adapter.CREDIT_PATHS)
  _, credit = zipf_explain.oracle.credit_from_cuts(values, cuts, task.length)
  p = task.prompt_length
  np.testing.assert_allclose(batch.extras["oracle_advantages"][:, p:], credit, atol=1e-6)
  assert np.all(mask[:, p:]) and not np.any(mask[:, :p])
  total = np.asarray(batch.extras["oracle_advantages"]).sum(axis=1)
  start = np.asarray(batch.extras["oracle_values"])[:, p]
  np.testing.assert_allclose(total, np.asarray(batch.rewards) - start, atol=1e-5)
  prompts, eval_targets = adapter.eval_prompts
  assert prompts.shape == (4, 4)  # all |C|^K = 4 prompts
  success = adapter.success(adapter.value_tree(model, prompts, eval_targets, jax.random.key(1)))
  expected, _ = zipf_explain.oracle.rb_values(
      model, jnp.pad(prompts, [(0, 0), (0, 8)]), eval_targets, jnp.zeros(1, jnp.int32),
      jax.random.key(1), task, n_paths=adapter.EVAL_PATHS)
  np.testing.assert_allclose(success, expected[:, 0], atol=1e-6)
  demo_prompts, responses = adapter.demonstrations(jax.random.key(2), cells.Warmup(
      steps=1, key_accuracy=1.0, batch_size=64), 64)
  assert np.all(zipf_explain.reward(np.asarray(responses), np.asarray(demo_prompts), task) == 1)
  with pytest.raises(ValueError, match="zipf_explain cells run without the gradient"):
    _cell("grpo", task=task, model=model_config, mechanism_batches=2)


def test_a_tree_cell_samples_trees_counts_shared_segments_once_and_scores_tree_credit():
  from jaxcredit.sampling import TreeSpec

  tree = TreeSpec(roots=1, branching=2, depth=2, segment_tokens=2)  # forks before 2 and 4
  cell = cells.Cell(task=TASK, model=MODEL, arms=("grpo", "treerl"), group_size=4,
                    prompts_per_step=3, updates=2, eval_every=1, tree=tree)
  assert cell.tokens_per_update == 3 * (2 + 2 * 2 + 4 * 2)  # 42 against 72 without a tree
  batch = jax.jit(lambda key: update_batch.make_rollout(cell)(
      Transformer(MODEL, rngs=nnx.Rngs(0)), key, oracle_extras=True))(jax.random.key(0))
  path, segments = (np.asarray(batch.extras[k]) for k in ("tree_path", "tree_segments"))
  tokens = np.asarray(batch.tokens)
  for a, b in ((0, 1), (2, 3)):  # siblings share the first two segments
    np.testing.assert_array_equal(tokens[a, :-2], tokens[b, :-2])
  np.testing.assert_array_equal(path[:, 0], np.repeat([0, 12, 24], 4))  # a tree per prompt
  assert (segments[:, -2:] == 2).all()
  result = batched.Runner(cell).train([(0, 1e-3, 0), (1, 1e-3, 0)])
  np.testing.assert_array_equal(result["gen_tokens"][:, -1], 2 * cell.tokens_per_update)
  # FLOPs likewise: a tree's prompt once, its segments once (1, 2 and 4 of them), each token
  # attending to its prefix; sampling and the step are 4 such passes.
  token = lambda t: flops.token_flops(MODEL, TASK.prompt_length + t + 1)
  tree_pass = flops.sequence_flops(MODEL, TASK.prompt_length, logits=False) + sum(
      width * (token(2 * s) + token(2 * s + 1)) for s, width in enumerate((1, 2, 4)))
  np.testing.assert_allclose(result["charged_flops"][:, -1], 2 * 4 * 3 * tree_pass, rtol=1e-5)
  assert compute.fixed_update_flops(cell, cell.arms[0]) is None  # a tree's shares are sampled
  assert np.all(np.isfinite(result["success"]))
  # The same seed samples the same first batch in both arms: a paired start.
  np.testing.assert_array_equal(result["success"][0, 0], result["success"][1, 0])
  with pytest.raises(ValueError, match="roots x branching\\^depth = group_size"):
    dataclasses.replace(cell, group_size=8)
