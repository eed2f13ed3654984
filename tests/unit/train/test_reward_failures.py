"""A reward function that raises is counted, reported for every step it happens in, and
stops the run (after a checkpoint) when it fails on task.max_reward_failures of a step."""

import json

import numpy as np
import pytest

from jaxcredit.tasks import arithmetic
from jaxcredit.train import loop
from tests.conftest import load_experiment


def _config(steps: int):
  config = load_experiment("quickstart")
  config.task.train_size, config.task.test_size, config.sft.max_steps = 64, 8, 0
  config.rl.prompts_per_step, config.rl.group_size = 4, 4
  config.rl.steps, config.rl.eval_every, config.checkpoint.every = steps, 100, 100
  config.export.every = 0
  return config


def _records(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
          if "train/loss" in line]


def test_failures_are_counted_and_reported_every_step(tmp_path, monkeypatch, capsys):
  reward = arithmetic.reward

  def fragile(response, answer):
    if "1" in response:
      raise ZeroDivisionError("a bug in the verifier")
    return reward(response, answer)

  monkeypatch.setattr(arithmetic, "reward", fragile)
  loop.run(_config(3), str(tmp_path))
  failures = [r["train/reward_failures"] for r in _records(tmp_path)]
  output = capsys.readouterr()
  reported = output.out + output.err
  assert len(failures) == 3 and all(0 < f < 16 for f in failures), failures
  for step, failed in enumerate(failures, start=1):
    assert (
      f"RL step {step}: the reward function raised on {int(failed)} of 16 responses, scored 0 "
      "(first: reward function raised ZeroDivisionError: a bug in the verifier)"
    ) in reported


def test_a_step_whose_whole_batch_fails_saves_the_updates_and_stops(tmp_path, monkeypatch):
  reward, calls = arithmetic.reward, []

  def breaks_after_two_steps(response, answer):
    calls.append(response)
    if len(calls) > 8 + 2 * 16:  # the first greedy eval, then two updates' batches
      raise RuntimeError("verifier lost its connection")
    return reward(response, answer)

  monkeypatch.setattr(arithmetic, "reward", breaks_after_two_steps)
  with pytest.raises(
    ValueError,
    match=r"At RL step 3 the reward function raised on 16 of 16 "
    r"responses, at least task.max_reward_failures = 1.0 .* resume from RL step 2",
  ):
    loop.run(_config(5), str(tmp_path))
  assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [2]
  assert [r["step"] for r in _records(tmp_path)] == [1, 2]


def test_a_lower_limit_stops_on_part_of_a_batch(tmp_path, monkeypatch):
  reward = arithmetic.reward
  monkeypatch.setattr(
    arithmetic,
    "reward",
    lambda response, answer: reward(response, answer) if len(response) % 2 else np.log(-1) / 0,
  )  # raises on half
  config = _config(3)
  config.task.max_reward_failures = 0.25
  with pytest.raises(ValueError, match=r"At RL step 1 the reward function raised on \d+ of 16"):
    loop.run(config, str(tmp_path))
