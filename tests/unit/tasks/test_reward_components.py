"""Reward components: countdown's (correct, well-formed) agree with its scalar reward, reach
GDPO through their extras provider in a training run, and a task without them is refused."""

import json

import numpy as np
import pytest

from jaxcredit.tasks import countdown
from jaxcredit.train import loop
from tests.conftest import load_experiment


@pytest.mark.parametrize("response,numbers,target", [
    ("<answer>3*4</answer>", [3, 4], 12), ("(3+4)*2", [3, 4, 2], 14), ("3+4", [3, 4], 12),
    ("3+4+4", [3, 4], 7), ("3+", [3], 3), ("", [1], 1), ("1/0", [1, 0], 1),
    ("<answer>7</answer>", [7], 7)])
def test_countdown_components_are_the_parts_of_its_reward(response, numbers, target):
  correct, well_formed = countdown.reward_components(response, numbers, target)
  reward, _ = countdown.reward(response, numbers, target, format_score=0.1)
  assert reward == (1.0 if correct else 0.1 if well_formed else 0.0)
  assert correct <= well_formed


def _countdown(advantage: str, steps: int = 2):
  config = load_experiment("countdown_grpo")
  config.task.train_size, config.task.test_size, config.sft.max_steps = 64, 8, 0
  config.rl.prompts_per_step, config.rl.group_size = 4, 4
  config.rl.steps, config.rl.eval_every, config.checkpoint.every = steps, 100, steps
  config.export.every = 0
  config.advantage = {"name": advantage}
  return config


def test_gdpo_trains_countdown_from_its_reward_components(tmp_path):
  loop.run(_countdown("gdpo"), str(tmp_path))
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
             if "train/loss" in line]
  assert len(records) == 2
  assert all(np.isfinite(r["train/loss"]) and np.isfinite(r["train/grad_norm"])
             for r in records)


def test_gdpo_on_a_task_without_reward_components_is_refused_before_any_work(tmp_path):
  config = load_experiment("quickstart")
  config.advantage = {"name": "gdpo"}
  with pytest.raises(ValueError, match="reward_components.*cannot be computed for task "
                                       "'arithmetic': its reward has no components"):
    loop.run(config, str(tmp_path))
  assert not (tmp_path / "metrics.jsonl").exists()
