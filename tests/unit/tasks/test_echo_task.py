"""The documented toy task (docs/examples/echo_task.py): one module and one registration make
a task the loop trains on."""

import importlib.util
import json

import ml_collections
import numpy as np
import pytest

from jaxcredit import tasks
from jaxcredit.train import loop
from tests.conftest import ROOT, load_experiment, doc_block


@pytest.fixture(scope="module")
def echo():
  spec = importlib.util.spec_from_file_location("echo_task",
                                                ROOT / "docs" / "examples" / "echo_task.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  yield module
  tasks.unregister("echo")


def _task_config(**overrides):
  return ml_collections.ConfigDict({"name": "echo", "options": {"n_digits": 4}, "train_size": 32,
                                    "test_size": 8, "max_prompt_length": 6,
                                    "max_response_length": 5, **overrides})


def test_the_toy_task_registers_and_scores_copies_one(echo, tmp_path):
  assert tasks.get("echo") is echo.TASK and "echo" in tasks.names()
  source = (ROOT / "docs" / "examples" / "echo_task.py").read_text()
  assert doc_block('name="echo"') in source and len(source.splitlines()) < 60
  task = tasks.make(_task_config(), data_dir=str(tmp_path), seed=0)
  examples = [task.sources["train"][i] for i in range(8)]
  completions = [task.encode(example)[1] for example in examples]  # digits + EOS
  assert all(len(ids) == 5 for ids in completions)
  tokens = np.full((8, 5), task.pad_id)
  for row, ids in enumerate(completions):
    tokens[row, :len(ids)] = ids
  mask = tokens != task.pad_id
  np.testing.assert_array_equal(task.score(tokens, mask, examples), np.ones(8))
  wrong = tokens.copy()
  wrong[:, 0] = np.where(wrong[:, 0] == tokens[0, 1], tokens[0, 2], tokens[0, 1])  # digit changed
  assert not task.score(wrong, mask, examples).any()
  with pytest.raises(ValueError, match="task.options has 'digits', which EchoConfig"):
    tasks.make(_task_config(options={"digits": 2}), data_dir=str(tmp_path), seed=0)


def test_the_loop_trains_on_the_toy_task(echo, tmp_path):
  config = load_experiment("quickstart")
  config.task.update(_task_config())
  config.task.options = ml_collections.ConfigDict({"n_digits": 4})  # not arithmetic's
  config.sft.max_steps = 2
  config.rl.update(steps=2, prompts_per_step=4, group_size=2, eval_every=2)
  loop.run(config, str(tmp_path / "run"))
  metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  rows = [json.loads(line) for line in metrics]
  rewards = [row["train/reward_mean"] for row in rows if "train/reward_mean" in row]
  assert len(rewards) == 2 and all(0.0 <= r <= 1.0 for r in rewards)
