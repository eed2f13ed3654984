"""Task hooks of the training loop, batch-size checks and minibatch orders (fast, in-process)."""

import ml_collections
import numpy as np
import pytest

from jaxcredit import tasks
from jaxcredit.tasks import loader
from jaxcredit.train import data, learner, refusals
from tests.conftest import load_experiment

OPTIONS = {
    "arithmetic": ({"min_digits": 1, "max_digits": 2}, 8, 6),
    "countdown": ({"n_numbers": 3, "max_number": 9}, 16, 24),
    "key_token": ({"length": 10, "n_keys": 4, "filler_blind": True}, 0, 0),
}


def _task(name, tmp_path):
  options, prompt, response = OPTIONS[name]
  config = ml_collections.ConfigDict(
    {
      "name": name,
      "options": options,
      "train_size": 24,
      "test_size": 8,
      "max_prompt_length": prompt,
      "max_response_length": response,
    }
  )
  return tasks.make(config, data_dir=str(tmp_path), seed=0)


def _demonstrations(task, rows=8):
  data = loader.Loader(
    task.sources["train"],
    encode=task.encode,
    batch_size=rows,
    max_prompt_length=task.max_prompt_length,
    pad_id=task.pad_id,
  )
  return data.sft_batch(0, length=task.max_prompt_length + task.max_response_length), data


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_demonstrations_score_one_and_use_allowed_actions(name, tmp_path):
  task = _task(name, tmp_path)
  batch, data = _demonstrations(task)
  response = slice(task.max_prompt_length, None)
  examples = [task.sources["train"][int(i)] for i in data.example_indices(0)]
  scores = task.score(batch["tokens"][:, response], batch["loss_mask"][:, response], examples)
  np.testing.assert_array_equal(scores, 1.0)
  allowed, hidden = task.actions.allowed, task.actions.hidden
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
  np.testing.assert_array_equal(
    data.noisy_demonstrations(tokens, loss_mask, rng, rate=0.0, task=task), tokens
  )
  noisy = data.noisy_demonstrations(tokens, loss_mask, rng, rate=1.0, task=task)
  changed = noisy != tokens
  np.testing.assert_array_equal(changed.sum(axis=1), 1)
  assert loss_mask[changed].all()
  allowed = task.actions.allowed
  assert allowed[np.nonzero(changed)[1], noisy[changed]].all()


def test_runs_with_other_task_options_never_share_a_data_dirs_files(tmp_path):
  def examples(**options):
    config = ml_collections.ConfigDict(
      {"name": "key_turns", "options": options, "train_size": 4, "test_size": 4}
    )
    source = tasks.make(config, data_dir=str(tmp_path), seed=0).sources["train"]
    return [source[i] for i in range(len(source))]

  assert all(len(e["keys"]) == 8 for e in examples(n_turns=8))
  assert all(len(e["keys"]) == 4 for e in examples(n_turns=4))
  again = examples(n_turns=8)  # the same options read their own files back
  assert all(len(e["keys"]) == 8 for e in again)


def test_unknown_task_lists_the_known_ones(tmp_path):
  config = ml_collections.ConfigDict({"name": "chess", "options": {}})
  with pytest.raises(
    ValueError,
    match="Unknown task 'chess'; known: arithmetic, calculator, countdown, gsm8k, key_token, "
    "key_turns, log_lookup, target_sum",
  ):
    tasks.make(config, data_dir=str(tmp_path), seed=0)
  with pytest.raises(ValueError, match="Task 'zipf_explain' runs in the batched lab only; the "
                     "training loop takes: arithmetic, calculator, countdown, gsm8k, key_token, "
                     "key_turns, log_lookup, target_sum."):
    tasks.make(ml_collections.ConfigDict({"name": "zipf_explain"}), data_dir=str(tmp_path),
               seed=0)


@pytest.mark.parametrize(
  "override,message",
  [
    ({"rl.minibatches": 3}, "not divisible by rl.minibatches = 3"),
    (
      {"rl.minibatches": 64},
      "a minibatch of 4 rows does not hold whole groups of rl.group_size = 8",
    ),
    ({"sft.batch_size": 250}, "sft.batch_size = 250 is not divisible by the 4"),
  ],
)
def test_batch_sizes_that_do_not_split_raise(override, message):
  config = load_experiment("quickstart")
  for key, value in override.items():
    section, field = key.split(".")
    config[section][field] = value
  with pytest.raises(ValueError, match=message):
    refusals.check_batch_sizes(config, devices=4)
  refusals.check_batch_sizes(load_experiment("quickstart"), devices=4)


def test_minibatches_partition_whole_groups():
  rows, group = 12, 3
  orders = learner.minibatch_orders(rows, group, 2, 2, 0, 5)  # 2 epochs x 2 minibatches
  assert orders.shape == (4, 6)
  for epoch in orders.reshape(2, 12):
    np.testing.assert_array_equal(np.sort(epoch), np.arange(rows))  # each epoch sees every row once
  in_groups = orders.reshape(4, -1, group)
  assert (in_groups % group == np.arange(group)).all() and (
    in_groups // group == in_groups[..., :1] // group
  ).all()
  assert not np.array_equal(orders[0], orders[2])  # a fresh group order per epoch
  assert learner.minibatch_orders(rows, group, 2, 1, 0, 5) is None  # one minibatch: the whole batch


def _arithmetic(tmp_path, **fields):
  config = {
    "name": "arithmetic",
    "options": {"min_digits": 2, "max_digits": 5},
    "train_size": 200,
    "test_size": 50,
    "max_prompt_length": 16,
    "max_response_length": 7,
    **fields,
  }
  return tasks.make(ml_collections.ConfigDict(config), data_dir=str(tmp_path), seed=0)


def _rows(task, responses: list[list[int]]):
  """[B, P + N] rows holding `responses` after an empty prompt, and their action mask."""
  p, n = task.max_prompt_length, task.max_response_length
  tokens, mask = (
    np.zeros((len(responses), p + n), np.int32),
    np.zeros((len(responses), p + n), bool),
  )
  for row, response in enumerate(responses):
    tokens[row, p : p + len(response)], mask[row, p : p + len(response)] = response, True
  return tokens, mask


def test_a_response_cut_off_by_the_budget_scores_the_truncation_rule(tmp_path):
  from jaxcredit.tasks import CharTokenizer, arithmetic

  tokenizer = CharTokenizer(arithmetic.ALPHABET)
  task = _arithmetic(tmp_path, max_response_length=2)
  example = {"prompt": b"5+7=", "answer": b"12", "completion": b"12"}
  # "125" cut at two tokens reads "12": the verifier alone calls it right.
  cut, finished = tokenizer.encode("12"), tokenizer.encode("1") + [tokenizer.eos_id]
  tokens, mask = _rows(task, [cut, finished])
  response = slice(task.max_prompt_length, None)
  np.testing.assert_array_equal(
    task.score(tokens[:, response], mask[:, response], [example] * 2), [1.0, 0.0]
  )
  np.testing.assert_array_equal(task.truncated(tokens, mask), [True, False])
  np.testing.assert_array_equal(task.score_rows(tokens, mask, [example] * 2), [0.0, 0.0])
  lenient = _arithmetic(tmp_path, max_response_length=2, truncated_reward=-0.5)
  np.testing.assert_array_equal(lenient.score_rows(tokens, mask, [example] * 2), [-0.5, 0.0])
  key_token = _task("key_token", tmp_path)  # fixed-length responses are never cut off
  assert not key_token.truncated(np.zeros((3, 14), np.int32), np.ones((3, 14), bool)).any()


def test_data_beyond_the_budgets_is_counted_and_too_much_refuses_to_start(tmp_path, capsys):
  task = _arithmetic(tmp_path, max_prompt_length=10, max_response_length=5)
  lengths = {
    split: np.asarray(
      [
        [len(ids) for ids in task.encode(task.sources[split][i])]
        for i in range(len(task.sources[split]))
      ]
    )
    for split in ("train", "test")
  }
  with pytest.raises(
    ValueError,
    match=r"\d+ of 50 test examples \(\d+\.\d%\) have prompts longer than "
    r"max_prompt_length = 10 tokens .* task.max_dropped_fraction = 0.1",
  ):
    data.check_data(task, max_dropped_fraction=0.1)
  report = data.check_data(task, max_dropped_fraction=1.0)
  for split, (prompt, answer) in ((s, lengths[s].T) for s in lengths):
    assert report[f"data/{split}/examples"] == len(prompt)
    assert report[f"data/{split}/dropped"] == np.sum(prompt > 10) > 0
    assert report[f"data/{split}/unrewardable"] == np.sum(answer > 5) > 0
  out = capsys.readouterr().out
  assert f"test: dropped {report['data/test/dropped']} of 50 examples" in out
  assert (
    f"Warning: {report['data/test/unrewardable']} of 50 test answers need more than "
    "max_response_length"
    in out
  )
  batch = data.evaluation_batch(task)  # each fitting test problem exactly once
  fitting = [task.sources["test"][i] for i in np.flatnonzero(lengths["test"][:, 0] <= 10)]
  assert len(batch["examples"]) == len(fitting) == 50 - report["data/test/dropped"]
  assert sorted(e["prompt"] for e in batch["examples"]) == sorted(e["prompt"] for e in fitting)


def test_evaluation_chunks_share_one_shape_and_cover_every_prompt_once():
  prompts = np.arange(5 * 3).reshape(5, 3)
  batch = {"prompts": prompts, "prompt_valid": prompts % 2 == 0, "examples": list("abcde")}
  chunks = list(data.batch_chunks(batch, 2))
  assert [rows for _, rows in chunks] == [2, 2, 1]
  assert all(
    chunk["prompts"].shape == (2, 3) and len(chunk["examples"]) == 2 for chunk, _ in chunks
  )
  real = lambda key: np.concatenate([chunk[key][:rows] for chunk, rows in chunks])
  np.testing.assert_array_equal(real("prompts"), prompts)
  np.testing.assert_array_equal(real("prompt_valid"), batch["prompt_valid"])
  assert sum((chunk["examples"][:rows] for chunk, rows in chunks), []) == list("abcde")
  ((whole, rows),) = data.batch_chunks(batch, None)
  assert rows == 5 and whole["examples"] == list("abcde")
