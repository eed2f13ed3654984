"""Settings no run can use are refused from the CLI in one line, naming the setting, before
any work: no metrics.jsonl is written (the first greedy eval would write one). The CLI runs
in the test's process on one device (`tests.cli.train_here`), in a process of its own on 8
host devices."""

import os

import pytest

from tests.cli import in_process, train, train_here
from tests.conftest import xla_flags

ARITHMETIC = ["--config.task.train_size=64", "--config.task.test_size=8", "--config.rl.steps=2"]


@pytest.mark.parametrize("overrides,message", [
    (["--config.advantage={'name': 'gae'}"],
     "gae needs rollout.values, which is None. This run never provides it: rollout.values: "
     "set critic.preset"),
    (["--config.objective={'policy': {'name': 'tis'}}"],
     "set --config.rl.recompute_old_logprobs=True"),
    (["--config.objective={'policy': {'name': 'decoupled_ppo', 'proximal': 'loglinear'}}"],
     "rollout.staleness: set rl.max_staleness > 0"),
    (["--config.advantage={'name': 'oracle'}"],
     "Estimator 'oracle' needs rollout.extras['oracle_advantages'], which cannot be computed for "
     "task 'arithmetic'"),
    (["--config.export.compare=('oracle',)"],
     "export.compare entry 'oracle': Estimator 'oracle' needs"),
    (["--config.task.test_size=0"], "task.test_size must be a positive int, got 0"),
    (["--config.task.train_size=0"], "task.train_size must be a positive int, got 0"),
    (["--config.rl.max_staleness=2.5"],
     "--config.rl.max_staleness=2.5: config.rl.max_staleness takes an int (default 0)"),
    (["--config.mesh.distributed=True"],
     "set --config.mesh.coordinator_address=HOST:PORT"),
    (["--config.task.options={'digits': 3}"],
     "task.options has 'digits', which ArithmeticConfig does not take; it takes: held_out, "
     "max_digits"),
])
def test_unusable_settings_are_refused_in_one_line_before_any_work(tmp_path, overrides, message):
  result = train_here(tmp_path, *ARITHMETIC, *overrides, tiny=False)
  assert result.returncode != 0
  assert message in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr and "sft step" not in result.stdout
  assert not (tmp_path / "metrics.jsonl").exists()


def test_settings_every_part_can_serve_still_train(tmp_path):
  """The check refuses only what is missing: gae with a critic, tis with recomputed old
  log-probs and the oracle on key_token start and finish."""
  result = train_here(tmp_path, "--config.advantage={'name': 'gae'}",
                      "--config.critic.preset=tiny",
                      "--config.objective={'policy': {'name': 'tis'}}",
                      "--config.rl.recompute_old_logprobs=True", "--config.rl.steps=1",
                      "--config.export.compare=('oracle', 'rloo')", "--config.export.every=1")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Warning: the per-token export failed" not in result.stderr


def test_help_lists_every_config_field_with_its_default_and_meaning():
  result = in_process(["--config", "experiments/gsm8k_grpo.py:smoke", "--help"])
  assert result.returncode == 0, result.stderr[-2000:]
  assert (
    "--config.rl.max_staleness=0\n      k > 0: update t's rollouts are sampled" in result.stdout
  )
  assert "--config.task.eval_size=4\n      greedy eval on the first" in result.stdout
  assert (
    "--config.task.instruction=" in result.stdout
    and "the reward reads the number right after the last '####'" in result.stdout
  )
  assert "--config.advantage.name='grpo'" in result.stdout


@pytest.mark.parametrize("task,mesh", [("key_token", "(2,1,2,2)"), ("target_sum", "(1,2,2,2)")])
def test_a_mesh_xla_cannot_partition_typed_actions_on_is_refused_naming_the_axes(
  tmp_path, task, mesh
):
  """These meshes abort the process inside XLA's SPMD partitioner at the first learner step."""
  env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8")}
  options = (
    [] if task == "key_token" else ["--config.task.name=target_sum", "--config.task.options={}"]
  )
  result = train(tmp_path, *options, f"--config.mesh.shape={mesh}", "--config.rl.steps=2", env=env)
  assert result.returncode == 1, result.stderr[-2000:]
  assert (
    f"Task {task!r} restricts the tokens allowed per position, and XLA cannot partition "
    f"that head over mesh.shape (data, fsdp, sequence, model) = {mesh.replace(',', ', ')}"
    in result.stderr
  )
  assert "Traceback" not in result.stderr and not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("task", ["key_token", "target_sum"])
def test_typed_actions_train_on_the_mesh_the_refusal_names(tmp_path, task):
  """(2, 2, 2, 1), the refusal's suggestion: data, fsdp and sequence axes over 1 with typed
  actions; two RL steps and their checkpoints finish (no deadlock, no abort)."""
  env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8")}
  options = (
    [] if task == "key_token" else ["--config.task.name=target_sum", "--config.task.options={}"]
  )
  result = train(
    tmp_path, *options, "--config.mesh.shape=(2,2,2,1)", "--config.rl.steps=2", env=env
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert (tmp_path / "checkpoints" / "2").exists()
