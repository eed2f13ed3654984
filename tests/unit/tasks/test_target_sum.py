"""target_sum: the task's rule against brute-force enumeration, its demonstrations,
its allowed actions and refusals, and a CLI-free training task bound to TFDS data."""

import itertools

import numpy as np
import pytest

from jaxcredit.tasks import target_sum as ts


def _rewarded_by_enumeration(config, target):
  """Every response (digits then EOS) with its reward, from the rule as written."""
  out = {}
  for k in range(config.n_digits + 1):
    if k < config.n_digits and not config.eos_allowed:
      continue
    for digits in itertools.product(range(config.n_values), repeat=k):
      good = sum(digits) == target
      good &= not config.exact_len or k == config.n_digits
      good &= not config.no_repeat or all(a != b for a, b in zip(digits, digits[1:]))
      out[digits] = float(good)
  return out


def _row(config, digits):
  row = np.full(config.length, ts.PAD, np.int32)
  row[:len(digits)] = ts.DIGIT0 + np.asarray(digits, np.int32)
  row[len(digits)] = ts.EOS
  return row


@pytest.mark.parametrize("options", [{}, {"exact_len": True, "target_low": 4, "target_high": 8},
                                     {"no_repeat": True, "n_values": 3, "n_digits": 4,
                                      "target_low": 1, "target_high": 6},
                                     {"eos_allowed": False, "n_digits": 3, "target_low": 0,
                                      "target_high": 9}])
def test_reward_and_demonstrations_follow_the_rule(options):
  config = ts.TargetSumConfig(**options)
  rng = np.random.default_rng(0)
  for target in (config.target_low, config.target_high):
    truth = _rewarded_by_enumeration(config, target)
    rows = np.stack([_row(config, d) for d in truth])
    np.testing.assert_array_equal(ts.reward(rows, np.full(len(rows), target), config),
                                  list(truth.values()))
    # The dynamic programme counts exactly the rewarded responses.
    assert ts.definition._completions(config, target)[0, 0, config.n_values] == sum(truth.values())
  for _ in range(50):
    example = ts.make_example(rng, config)
    completion = example["completion"]
    assert completion[-1] == ts.EOS and len(completion) <= config.length
    assert list(example["prompt"]) == [ts.BOS, ts.DIGIT0 + config.n_digits,
                                       ts.DIGIT0 + example["target"] // 10,
                                       ts.DIGIT0 + example["target"] % 10, ts.SEP]
    row = np.full(config.length, ts.PAD, np.int32)
    row[:len(completion)] = completion
    assert ts.reward(row[None], np.asarray([example["target"]]), config)[0] == 1.0
    assert ts.allowed(config)[np.arange(len(completion)), completion].all()


def test_demonstrations_are_uniform_over_the_rewarded_responses():
  config = ts.TargetSumConfig(n_digits=3, n_values=3, target_low=2, target_high=2)
  rewarded = [d for d, r in _rewarded_by_enumeration(config, 2).items() if r]
  rng = np.random.default_rng(1)
  draws = [tuple(ts.make_example(rng, config)["completion"][:-1] - ts.DIGIT0)
           for _ in range(6000)]
  counts = np.asarray([draws.count(d) for d in rewarded])
  assert counts.sum() == len(draws)
  expected = len(draws) / len(rewarded)
  assert np.abs(counts - expected).max() < 5 * np.sqrt(expected)


def test_allowed_actions_force_eos_after_n_digits():
  table = ts.allowed(ts.TargetSumConfig(n_digits=2, n_values=3, target_low=0, target_high=4))
  assert table.shape == (3, ts.VOCAB_SIZE)
  np.testing.assert_array_equal(np.flatnonzero(table[0]), [ts.EOS, 4, 5, 6])
  np.testing.assert_array_equal(np.flatnonzero(table[2]), [ts.EOS])
  assert ts.token_names([3, 4, 13, 14]) == ["EOS", "0", "9", "R14"]


@pytest.mark.parametrize("options,match", [
    ({"n_digits": 10}, "n_digits must be in"),
    ({"n_values": 1}, "n_values must be in"),
    ({"target_high": 19}, r"target_high <= min\(99"),
    ({"n_values": 2, "no_repeat": True, "target_low": 0, "target_high": 6},
     r"targets \[4, 5, 6\]"),
])
def test_bad_configs_are_named(options, match):
  with pytest.raises(ValueError, match=match):
    ts.TargetSumConfig(**options)


def test_a_response_without_eos_or_with_a_foreign_token_earns_nothing():
  config = ts.TargetSumConfig()
  no_eos = np.full(config.length, ts.DIGIT0 + 2, np.int32)
  foreign = _row(config, [3, 3, 3, 3, 3])
  foreign[1] = ts.DIGIT0 + 7  # digit 7 is not an action at m = 4
  assert ts.reward(np.stack([no_eos, foreign]), np.asarray([14, 19]), config).tolist() == [0, 0]
  with pytest.raises(ValueError, match=r"Expected responses \[B, 7\] and targets \[B\]"):
    ts.reward(no_eos[None, :5], np.asarray([3]), config)


def test_the_training_task_scores_rows_from_its_tfds_data(tmp_path):
  import ml_collections

  from jaxcredit import tasks

  config = ml_collections.ConfigDict({"name": "target_sum", "options": {}, "train_size": 16,
                                      "test_size": 4})
  task = tasks.make(config, data_dir=str(tmp_path), seed=0)
  assert (task.max_prompt_length, task.max_response_length, task.stop_tokens) == (5, 7, (ts.EOS,))
  examples = [task.sources["train"][i] for i in range(4)]
  rows = np.zeros((4, 12), np.int32)
  for row, example in zip(rows, examples):
    row[:5] = example["prompt"]
    row[5:5 + len(example["completion"])] = example["completion"]
  mask = np.zeros(rows.shape, bool)
  mask[:, 5:] = rows[:, 5:] != ts.PAD
  np.testing.assert_array_equal(task.score_rows(rows, mask, examples), 1.0)
  rows[:, 5] = ts.EOS  # stop at once: S >= 3 is missed
  np.testing.assert_array_equal(task.score_rows(rows, mask, examples), 0.0)
  assert task.actions.allowed.shape == (12, ts.VOCAB_SIZE)
