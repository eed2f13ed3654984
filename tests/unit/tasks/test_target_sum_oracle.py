"""E-TREE on target_sum against brute-force enumeration of every response, with a model
whose conditionals depend on the whole prefix."""

import itertools

import jax
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models import Transformer, preset
from jaxcredit.tasks import target_sum as ts


@pytest.fixture(scope="module")
def model():
  model = Transformer(preset("tiny", vocab_size=ts.VOCAB_SIZE), rngs=nnx.Rngs(3))
  rng = np.random.default_rng(0)
  state = nnx.state(model, nnx.Param)  # sharper conditionals than the init's
  nnx.update(model, jax.tree.map(lambda x: x * 3 + 0.05 * rng.normal(size=x.shape).astype(x.dtype),
                                 state))
  return model


def _log_conditionals(model, config, prompt, prefixes):
  """{prefix: log pi(. | prompt, prefix) over the allowed tokens}, float64, from one
  teacher-forced pass per prefix."""
  allowed = ts.allowed(config)
  last_logits = nnx.jit(lambda model, ids: model(ids).logits[0, -1])  # a program per length
  out = {}
  for prefix in prefixes:
    ids = np.asarray([*prompt, *(ts.DIGIT0 + np.asarray(prefix, np.int64))], np.int32)[None]
    logits = np.asarray(last_logits(model, ids), np.float64)
    logits = np.where(allowed[len(prefix)], logits, -np.inf)
    out[prefix] = logits - np.logaddexp.reduce(logits[np.isfinite(logits)])
  return out


def _enumerated_values(model, config, prompt, target):
  """V(u) for every prefix u: the sum over complete responses through u of their
  probability given u times their reward, enumerated."""
  prefixes = [p for k in range(config.n_digits + 1)
              for p in itertools.product(range(config.n_values), repeat=k)]
  logp = _log_conditionals(model, config, prompt, [p for p in prefixes if len(p) < config.n_digits])
  complete = []  # (digits, log-prob of the whole response)
  for digits in prefixes:
    steps = [logp[digits[:t]][ts.DIGIT0 + d] for t, d in enumerate(digits)]
    stop = logp[digits][ts.EOS] if len(digits) < config.n_digits else 0.0  # forced after n
    if np.isfinite(stop):
      complete.append((digits, sum(steps) + stop))
  rewards = {d: float(ts.reward(np.concatenate([ts.DIGIT0 + np.asarray(d, np.int32), [ts.EOS],
                                               np.zeros(config.n_digits - len(d), np.int32)])[None],
                               np.asarray([target]), config)[0]) for d, _ in complete}
  values = {}
  for u in prefixes:
    prefix_logp = sum(logp[u[:t]][ts.DIGIT0 + d] for t, d in enumerate(u))
    values[u] = sum(np.exp(lp - prefix_logp) * rewards[d] for d, lp in complete if d[:len(u)] == u)
  return values, rewards


@pytest.mark.parametrize("options", [
    {"n_digits": 3, "n_values": 3, "target_low": 0, "target_high": 6},
    {"n_digits": 3, "n_values": 3, "target_low": 1, "target_high": 5, "exact_len": True,
     "no_repeat": True},
    {"n_digits": 2, "n_values": 4, "target_low": 0, "target_high": 6, "eos_allowed": False},
])
def test_tree_values_and_credit_equal_enumeration(model, options):
  config = ts.TargetSumConfig(**options)
  rng = np.random.default_rng(1)
  rows, targets, expected_values = [], [], []
  for target in (config.target_low, (config.target_low + config.target_high) // 2,
                 config.target_high):
    prompt = [ts.BOS, ts.DIGIT0 + config.n_digits, ts.DIGIT0 + target // 10,
              ts.DIGIT0 + target % 10, ts.SEP]
    values, rewards = _enumerated_values(model, config, prompt, target)
    for digits in [list(d) for d in rewards][::2] + [list(rng.integers(0, config.n_values,
                                                                          config.n_digits))]:
      if not config.eos_allowed and len(digits) < config.n_digits:
        continue
      response = [*(ts.DIGIT0 + np.asarray(digits, np.int32)), ts.EOS]
      rows.append(np.asarray(prompt + response + [ts.PAD] * (config.length - len(response))))
      targets.append(target)
      states = [values[tuple(digits[:t])] for t in range(len(digits) + 1)]
      expected_values.append(states + [rewards[tuple(digits)]])
  rows, targets = np.stack(rows), np.asarray(targets)
  mask = np.zeros(rows.shape, bool)
  mask[:, 5:] = rows[:, 5:] != ts.PAD
  credit = ts.oracle.tree_credit(model, config, rows, mask, targets)
  for row, expected in enumerate(expected_values):
    got_values = np.asarray(credit.values)[row, 5:5 + len(expected) - 1]
    np.testing.assert_allclose(got_values, expected[:-1], atol=2e-5)
    np.testing.assert_allclose(np.asarray(credit.advantages)[row, 5:5 + len(expected) - 1],
                               np.diff(expected), atol=3e-5)
  assert np.all(np.asarray(credit.values)[~mask] == 0)
  # Along every response the advantages telescope to R - V(x).
  np.testing.assert_allclose(np.asarray(credit.advantages).sum(1),
                             [e[-1] - e[0] for e in expected_values], atol=5e-5)
  success = ts.oracle.exact_success(model, config, rows[:, :5], targets)
  np.testing.assert_allclose(success, [e[0] for e in expected_values], atol=2e-5)


def test_bad_rows_and_trees_too_large_are_named(model):
  config = ts.TargetSumConfig()
  rows = np.zeros((2, 12), np.int32)
  with pytest.raises(ValueError, match=r"Expected rows \[B, 5 \+ 7\] and targets \[B\]"):
    ts.oracle.tree_credit(model, config, rows[:, :11], rows[:, :11] > 0, np.zeros(2))
  mask = np.zeros(rows.shape, bool)
  mask[:, 5:] = True
  with pytest.raises(ValueError, match="does not allow at its position, or no EOS"):
    ts.oracle.tree_credit(model, config, rows, mask, np.zeros(2))
  rows[:, 5], mask[:, 6:] = ts.EOS, False  # stop at once: valid rows
  with pytest.raises(ValueError, match=r"needs 1,024 teacher-forced paths .* over max_passes"):
    ts.oracle.tree_credit(model, config, rows, mask, np.zeros(2), max_passes=1000)


def test_the_oracle_provider_and_exact_success_hook_serve_target_sum(model, tmp_path):
  """The training loop's extras provider of the `oracle` estimators and the exact J(pi)
  hook, on target_sum rows and prompts from its TFDS data: equal to its oracle's."""
  import ml_collections

  from jaxcredit import Rollout, tasks
  from jaxcredit.credit import extras
  from jaxcredit.lab import exact_metrics, providers

  task_config = {"n_digits": 3, "n_values": 3, "target_low": 1, "target_high": 5}
  task = tasks.make(ml_collections.ConfigDict({"name": "target_sum", "options": task_config,
                                               "train_size": 8, "test_size": 6}),
                    data_dir=str(tmp_path), seed=0)
  examples = [task.sources["train"][i] for i in range(4)]
  rows = np.zeros((4, 9), np.int32)
  for row, example in zip(rows, examples):  # each example's demonstration as the response
    row[:5], row[5:5 + len(example["completion"])] = example["prompt"], example["completion"]
  mask = np.zeros(rows.shape, bool)
  mask[:, 5:] = rows[:, 5:] != ts.PAD
  rollout = Rollout(tokens=rows, mask=mask, rewards=np.ones(4, np.float32))
  got, _ = providers.exact_credit(model, task, rollout, examples)
  targets = np.asarray([int(e["target"]) for e in examples])
  want = ts.oracle.tree_credit(model, task.config, rows, mask, targets)
  np.testing.assert_allclose(got["oracle_advantages"], want.advantages, atol=1e-6)
  np.testing.assert_allclose(got["oracle_values"], want.values, atol=1e-6)
  test = [task.sources["test"][i] for i in range(6)]
  context = extras.Context(task=task, model=model, examples=examples,
                           key=jax.random.key(0), rl_step=0)
  _, metrics = exact_metrics.hook(1, ks=(4,))(context, rollout)
  success = ts.oracle.exact_success(model, task.config, np.stack([e["prompt"] for e in test]),
                                    np.asarray([int(e["target"]) for e in test]))
  np.testing.assert_allclose(metrics["exact_success"], success.mean(), atol=1e-6)
  np.testing.assert_allclose(metrics["exact_pass@4"], np.mean(1 - (1 - success) ** 4), atol=1e-6)
