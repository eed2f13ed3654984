"""Task hooks of the training loop, batch-size checks and minibatching (fast, in-process)."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxcredit.rollout import Estimate, Rollout
from jaxcredit.tasks import loader
from jaxcredit.train import loop, tasks
from tests.conftest import load_experiment

OPTIONS = {
    "arithmetic": ({"min_digits": 1, "max_digits": 2}, 8, 6),
    "countdown": ({"n_numbers": 3, "max_number": 9}, 16, 24),
    "key_token": ({"length": 10, "n_keys": 4, "filler_blind": True}, 0, 0),
}


def _task(name, tmp_path):
  options, prompt, response = OPTIONS[name]
  config = ml_collections.ConfigDict({"name": name, "options": options, "train_size": 24, "test_size": 8,
                                      "max_prompt_length": prompt, "max_response_length": response})
  return tasks.make(config, data_dir=str(tmp_path), seed=0)


def _demonstrations(task, rows=8):
  data = loader.Loader(task.sources["train"], encode=task.encode, batch_size=rows,
                       max_prompt_length=task.max_prompt_length, pad_id=task.pad_id)
  return data.sft_batch(0, length=task.max_prompt_length + task.max_response_length), data


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_demonstrations_score_one_and_use_allowed_actions(name, tmp_path):
  task = _task(name, tmp_path)
  batch, data = _demonstrations(task)
  response = slice(task.max_prompt_length, None)
  examples = [task.sources["train"][int(i)] for i in data.example_indices(0)]
  scores = task.score(batch["tokens"][:, response], batch["loss_mask"][:, response], examples)
  np.testing.assert_array_equal(scores, 1.0)
  allowed, hidden = tasks.row_tables(task)
  if name == "key_token":
    columns = np.arange(batch["tokens"].shape[1])
    assert allowed[columns, batch["tokens"]][batch["loss_mask"]].all()
    assert hidden.sum() == task.max_response_length - 2  # all but the two decisive positions
  else:
    assert allowed is None and hidden is None and task.stop_tokens


def test_noisy_demonstrations_change_one_allowed_token_per_corrupted_row(tmp_path):
  task = _task("key_token", tmp_path)
  batch, _ = _demonstrations(task)
  tokens, loss_mask = batch["tokens"], batch["loss_mask"]
  rng = np.random.default_rng(0)
  np.testing.assert_array_equal(tasks.noisy_demonstrations(tokens, loss_mask, rng, rate=0.0, task=task), tokens)
  noisy = tasks.noisy_demonstrations(tokens, loss_mask, rng, rate=1.0, task=task)
  changed = noisy != tokens
  np.testing.assert_array_equal(changed.sum(axis=1), 1)
  assert loss_mask[changed].all()
  allowed, _ = tasks.row_tables(task)
  assert allowed[np.nonzero(changed)[1], noisy[changed]].all()


def test_unknown_task_lists_the_known_ones(tmp_path):
  config = ml_collections.ConfigDict({"name": "chess", "options": {}})
  with pytest.raises(ValueError, match="Unknown task 'chess'; known: arithmetic, countdown, key_token"):
    tasks.make(config, data_dir=str(tmp_path), seed=0)


@pytest.mark.parametrize("override,message", [
    ({"rl.minibatches": 3}, "not divisible by rl.minibatches = 3"),
    ({"rl.minibatches": 64}, "a minibatch of 4 rows does not hold whole groups of rl.group_size = 8"),
    ({"sft.batch_size": 250}, "sft.batch_size = 250 is not divisible by the 4"),
])
def test_batch_sizes_that_do_not_split_raise(override, message):
  config = load_experiment("quickstart")
  for key, value in override.items():
    section, field = key.split(".")
    config[section][field] = value
  with pytest.raises(ValueError, match=message):
    loop.check_batch_sizes(config, devices=4)
  loop.check_batch_sizes(load_experiment("quickstart"), devices=4)


def test_minibatches_partition_whole_groups():
  rows, group = 12, 3
  rollout = Rollout(tokens=jnp.arange(rows)[:, None] * jnp.ones((1, 4), int), mask=jnp.ones((rows, 4), bool),
                    rewards=jnp.arange(rows, dtype=jnp.float32), group_size=group)
  estimate = Estimate(advantages=jnp.arange(rows, dtype=jnp.float32)[:, None] * jnp.ones((1, 4)), returns=None)
  parts = list(loop.minibatches(rollout, estimate, 2, np.random.default_rng(0)))
  assert len(parts) == 2
  seen = np.concatenate([np.asarray(r.rewards) for r, _ in parts])
  np.testing.assert_array_equal(np.sort(seen), np.arange(rows))
  for r, e in parts:
    np.testing.assert_array_equal(np.asarray(r.tokens[:, 0]), np.asarray(r.rewards))  # rows stay aligned
    np.testing.assert_array_equal(np.asarray(e.advantages[:, 0]), np.asarray(r.rewards))
    groups = np.asarray(r.rewards).reshape(-1, group) // group
    assert (groups == groups[:, :1]).all()  # whole, contiguous groups
  (only, _), = loop.minibatches(rollout, estimate, 1, np.random.default_rng(0))
  assert only is rollout
