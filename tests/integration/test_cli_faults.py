"""Fault injection on the training CLI: bad overrides and hyperparameters, an
unwritable checkpoint directory, a cut-off metrics line, corrupt checkpoints,
a resume with other settings, and SIGTERM during SFT. Each must end in one
clear message or an exact resume, never a traceback, a hang or lost data.

One small run (key_token, no SFT, 4 RL steps, a checkpoint every step) is
shared; most faults are refused before any compilation, so the module stays
well under two minutes on 2 CPU cores."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.cli import command as _command, metrics as _metrics, train as _train, train_here
from tests.conftest import ROOT, xla_flags


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A workdir with checkpoints 1-4 of a finished 4-step run."""
  workdir = tmp_path_factory.mktemp("finished")
  result = train_here(workdir, "--config.rl.steps=4")
  assert result.returncode == 0, result.stderr[-3000:]
  return workdir


def _copy(finished, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(finished, workdir, symlinks=True)
  return workdir


@pytest.mark.parametrize("override,message", [
    ("--config.rl.grop_size=2", "unknown config field rl.grop_size (did you mean rl.group_size?)"),
    ("--config.foo=1", "unknown config field foo; the config has: advantage, checkpoint, critic"),
    ("--config.rl.group_size=0", "rl.group_size must be a positive int, got 0"),
    ("--config.rl.steps=-5", "rl.steps must be an int >= 0, got -5"),
    ("--config.rl.learning_rate=nan", "rl.learning_rate must be a number in (0.0, inf], got nan"),
    ("--config.advantage={'name': 'grpoo'}", "Unknown estimator 'grpoo'"),
    ("--config.mesh.shape=(2,2,2)", "mesh.shape gives the sizes of (data, fsdp, sequence, model)"),
])
def test_bad_overrides_are_refused_in_one_line_before_any_work(tmp_path, override, message):
  result = train_here(tmp_path, override)
  assert result.returncode != 0
  assert message in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
  assert not (tmp_path / "metrics.jsonl").exists()


def test_an_unwritable_checkpoint_directory_fails_before_any_work(tmp_path):
  # /proc refuses new files even to root, where chmod would not.
  (tmp_path / "checkpoints").symlink_to("/proc/self")
  started = time.perf_counter()
  result = train_here(tmp_path, "--config.rl.steps=4")
  assert result.returncode != 0
  assert "checkpoints is not writable" in result.stderr and "nothing was run" in result.stderr
  assert "Traceback" not in result.stderr and not (tmp_path / "metrics.jsonl").exists()
  assert time.perf_counter() - started < 60  # no orbax barrier time-out


def test_a_cut_off_metrics_line_and_corrupt_checkpoints_resume_from_the_newest_good_one(
  finished, tmp_path, cli_env
):
  workdir = _copy(finished, tmp_path)
  metrics = workdir / "metrics.jsonl"
  metrics.write_text(metrics.read_text()[:-25])  # a crash mid-write leaves half a line
  checkpoints = workdir / "checkpoints"
  metadata = checkpoints / "4" / "default" / "_METADATA"
  metadata.write_bytes(metadata.read_bytes()[: metadata.stat().st_size // 2])
  for data in (checkpoints / "3" / "default").rglob("d/*"):
    data.write_bytes(data.read_bytes()[:16])
  # A process of its own: orbax's reads of the corrupt checkpoints leave failed asyncio tasks.
  result = _train(workdir, "--config.rl.steps=5", env=cli_env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Dropped the incomplete last line" in result.stdout
  for step in (4, 3):
    assert f"Checkpoint {step} in {checkpoints} does not restore" in result.stdout, result.stdout[
      -3000:
    ]
    assert (workdir / "checkpoints.corrupt" / str(step)).is_dir()  # set aside, never deleted
  assert "Resuming RL at step 2" in result.stdout
  steps = [line["step"] for line in _metrics(workdir)]  # strict JSON again, one line per step
  assert steps == sorted(set(steps)) and steps[-1] == 5
  assert sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) == [
    2,
    3,
    4,
    5,
  ]  # keep=4


def test_intact_checkpoints_of_other_settings_are_refused_and_never_moved(finished, tmp_path):
  """A branched run: the checkpoints copied into a new workdir (no config.json) and resumed
  with a critic. They are intact, so this is a settings error, not corruption."""
  workdir = tmp_path / "branch"
  shutil.copytree(finished / "checkpoints", workdir / "checkpoints")
  before = sorted(p.name for p in (workdir / "checkpoints").iterdir())
  result = train_here(workdir, "--config.rl.steps=6", "--config.critic.preset=tiny")
  assert result.returncode != 0
  assert "Checkpoint 4 in" in result.stderr and "is intact but holds other state" in result.stderr
  assert "not in the checkpoint: critic" in result.stderr and "Nothing was moved" in result.stderr
  assert "Traceback" not in result.stderr, result.stderr[-2000:]
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == before
  assert not (workdir / "checkpoints.corrupt").exists()


@pytest.mark.parametrize(
  "override,differing",
  [
    ("--config.rl.group_size=2", "rl.group_size: 4 -> 2"),
    ("--config.model.preset=small", "model.preset: 'tiny' -> 'small'"),
  ],
)
def test_resuming_with_other_settings_is_refused_naming_them(
  finished, tmp_path, override, differing
):
  workdir = _copy(finished, tmp_path)
  saved_config = (workdir / "config.json").read_text()
  result = train_here(workdir, "--config.rl.steps=6", override)
  assert result.returncode != 0
  assert differing in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
  assert (workdir / "config.json").read_text() == saved_config


def test_sigterm_during_sft_exits_cleanly(tmp_path):
  process = subprocess.Popen(
    _command(
      tmp_path,
      "--config.task.name=arithmetic",
      "--config.task.options={}",
      "--config.sft.max_steps=100000",
      "--config.sft.batch_size=8",
      "--config.sft.eval_every=100000",
      "--config.rl.steps=1",
    ),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    cwd=ROOT,
  )
  deadline = time.time() + 300
  while not (tmp_path / "metrics.jsonl").exists():  # written after the first eval, as SFT starts
    assert process.poll() is None and time.time() < deadline, process.stderr.read()[-3000:]
    time.sleep(0.1)
  time.sleep(2.0)
  process.send_signal(signal.SIGTERM)
  stdout, stderr = process.communicate(timeout=120)
  assert process.returncode == 0, stderr[-3000:]
  assert "SIGTERM during SFT" in stdout and "Traceback" not in stderr


def test_a_failed_save_is_raised_at_the_next_step_with_its_cause_in_one_line(tmp_path):
  from flax import nnx

  from jaxcredit.models import sharding
  from jaxcredit.train import checkpoints

  module, mesh = nnx.Linear(2, 3, rngs=nnx.Rngs(0)), sharding.make_mesh()
  checkpointer = checkpoints.Checkpointer(tmp_path / "checkpoints")
  checkpointer.save(1, {"model": module}, {"rl_step": 1, "step": 1, "gen_tokens": 0}, mesh)
  checkpointer.wait()
  shutil.rmtree(tmp_path / "checkpoints")
  (tmp_path / "checkpoints").write_text("the disk went away")  # every later write fails
  with pytest.raises(
    checkpoints.CheckpointError, match=r"failed: \w+Error: .*checkpoints"
  ) as error:
    checkpointer.save(2, {"model": module}, {"rl_step": 2, "step": 2, "gen_tokens": 0}, mesh)
    checkpointer.check()  # what the loop runs at the start of every step
    checkpointer.wait()
  assert "\n" not in str(error.value)


def test_a_save_orbax_declines_is_an_error_not_a_silent_skip(tmp_path):
  from flax import nnx

  from jaxcredit.models import sharding
  from jaxcredit.train import checkpoints

  module, mesh = nnx.Linear(2, 3, rngs=nnx.Rngs(0)), sharding.make_mesh()
  checkpointer = checkpoints.Checkpointer(tmp_path / "checkpoints")
  counters = {"rl_step": 2, "step": 2, "gen_tokens": 0}
  checkpointer.save(2, {"model": module}, counters, mesh)
  checkpointer.wait()
  with pytest.raises(checkpoints.CheckpointError, match="checkpoint 2 was not saved.*holds step 2"):
    checkpointer.save(2, {"model": module}, counters, mesh)


def test_metrics_resume_drops_a_cut_off_last_line(tmp_path):
  from jaxcredit.train.metrics import MetricsWriter

  (tmp_path / "metrics.jsonl").write_text(
    '{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 3, "a"'
  )
  MetricsWriter(tmp_path, resume_step=2).write(3, {"a": 3.0})
  assert _metrics(tmp_path) == [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}, {"step": 3, "a": 3.0}]


def test_a_second_process_on_a_workdir_refuses_naming_the_holder(tmp_path):
  from jaxcredit.train import workdir_lock

  with workdir_lock.WorkdirLock(tmp_path):
    result = _train(tmp_path, "--config.rl.steps=4")
  assert result.returncode != 0
  assert f"is in use by host {socket.gethostname()} pid {os.getpid()}" in result.stderr, (
    result.stderr[-2000:]
  )
  assert "Traceback" not in result.stderr and not (tmp_path / "metrics.jsonl").exists()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
  from jaxcredit.train import workdir_lock

  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      (
        "import pathlib, sys, time; from jaxcredit.train import workdir_lock\n"
        f"with workdir_lock.WorkdirLock(pathlib.Path({str(tmp_path)!r})): "
        "print('held', flush=True); time.sleep(600)"
      ),
    ],
    stdout=subprocess.PIPE,
    text=True,
    cwd=ROOT,
  )
  assert holder.stdout.readline().strip() == "held"
  with pytest.raises(workdir_lock.WorkdirBusy, match=f"pid {holder.pid}"):
    workdir_lock.WorkdirLock(tmp_path).__enter__()
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  with workdir_lock.WorkdirLock(tmp_path):
    assert (tmp_path / ".lock").read_text() == f"host {socket.gethostname()} pid {os.getpid()}\n"


def test_rerunning_a_finished_run_with_fewer_steps_changes_nothing(finished, tmp_path):
  workdir = _copy(finished, tmp_path)
  saved = {name: (workdir / name).read_text() for name in ("config.json", "metrics.jsonl")}
  result = train_here(workdir, "--config.rl.steps=2")
  assert result.returncode == 0, result.stderr[-2000:]
  assert "already at RL step 4 >= rl.steps = 2: nothing to do" in result.stdout
  assert {name: (workdir / name).read_text() for name in saved} == saved


def test_ctrl_c_during_rl_saves_and_exits_cleanly(tmp_path, cli_env):
  process = subprocess.Popen(
    _command(tmp_path, "--config.rl.steps=200"),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    cwd=ROOT,
    env=cli_env,
  )
  deadline = time.time() + 300
  while not (tmp_path / "checkpoints" / "1").exists():
    assert process.poll() is None and time.time() < deadline, process.stderr.read()[-3000:]
    time.sleep(0.05)
  process.send_signal(signal.SIGINT)
  stdout, stderr = process.communicate(timeout=120)
  assert process.returncode == 0, stderr[-3000:]
  assert "SIGINT: saved a checkpoint at RL step" in stdout and "Traceback" not in stderr
  saved = max(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert saved < 200 and max(line["step"] for line in _metrics(tmp_path)) == saved


def test_non_finite_rewards_stop_the_run_naming_task_step_and_row():
  import numpy as np

  from jaxcredit.train import refusals

  refusals.check_rewards(np.array([0.0, 1.0]), task="arithmetic", rl_step=3)
  with pytest.raises(
    ValueError,
    match=r"Task 'countdown' gave non-finite rewards at RL step 7: row 1 = nan "
    r"\(2 of 4 rows\)",
  ):
    refusals.check_rewards(np.array([0.0, np.nan, 1.0, np.inf]), task="countdown", rl_step=7)


def test_metrics_stay_strict_json(tmp_path):
  from jaxcredit.train.metrics import MetricsWriter

  MetricsWriter(tmp_path).write(1, {"a": float("nan"), "b": float("inf"), "c": 2.0})
  line = (tmp_path / "metrics.jsonl").read_text()
  assert json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in {line}")) == {
    "step": 1,
    "a": None,
    "b": None,
    "c": 2.0,
  }


# Multi-device resume. Meshes: "1" (one CPU device), "8" (8 forced devices,
# data=8) and "2x2x2" ((data, fsdp, sequence, model) = (2, 2, 1, 2) on 8 forced devices).
MESHES = {"1": (1, []), "8": (8, []), "2x2x2": (8, ["--config.mesh.shape=(2,2,1,2)"])}


def _on(mesh, cli_env):
  """(overrides, env) that run the CLI on `mesh`."""
  devices, overrides = MESHES[mesh]
  return overrides, {
    **cli_env,
    "XLA_FLAGS": xla_flags(f"--xla_force_host_platform_device_count={devices}"),
  }


@pytest.fixture(scope="module")
def uninterrupted(finished, tmp_path_factory, cli_env):
  """uninterrupted(mesh): the workdir of a 4-step run on `mesh` with checkpoints 1-4 (run once
  per module)."""
  runs = {"1": finished}

  def get(mesh):
    if mesh not in runs:
      overrides, env = _on(mesh, cli_env)
      runs[mesh] = tmp_path_factory.mktemp(f"uninterrupted-{mesh}")
      result = _train(runs[mesh], "--config.rl.steps=4", *overrides, env=env)
      assert result.returncode == 0, result.stderr[-3000:]
    return runs[mesh]

  return get


def _assert_resumed_like(workdir, reference, after):
  """Every metric logged after step `after` equals the reference run's within 1e-4."""
  import numpy as np

  got = {line["step"]: line for line in _metrics(workdir) if line["step"] > after}
  want = {line["step"]: line for line in _metrics(reference) if line["step"] > after}
  assert sorted(got) == sorted(want) and got, (sorted(got), sorted(want))
  for step, line in want.items():
    assert sorted(got[step]) == sorted(line)
    for key in line:
      if key != "train/tokens_per_sec":
        np.testing.assert_allclose(
          got[step][key], line[key], rtol=1e-4, atol=1e-4, err_msg=f"{key} at {step}"
        )


def _resumed_at(stdout):
  line = next(line for line in stdout.splitlines() if line.startswith("Resuming RL at step "))
  return int(line.split()[4])


def _launch(workdir, mesh, cli_env, *overrides):
  mesh_overrides, env = _on(mesh, cli_env)
  return subprocess.Popen(
    _command(workdir, *mesh_overrides, *overrides),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    cwd=ROOT,
    env=env,
  )


def _wait_for(path, process):
  deadline = time.time() + 300
  while not path.exists():
    assert process.poll() is None and time.time() < deadline, process.stderr.read()[-3000:]
    time.sleep(0.02)


def test_kill_9_after_a_checkpoint_resumes_exactly_on_8_devices(uninterrupted, tmp_path, cli_env):
  workdir = tmp_path / "a run dir ü"  # spaces and non-ASCII in the path
  process = _launch(workdir, "8", cli_env, "--config.rl.steps=4")
  _wait_for(workdir / "checkpoints" / "1", process)
  process.kill()
  process.communicate()
  assert process.returncode == -signal.SIGKILL
  overrides, env = _on("8", cli_env)
  result = _train(workdir, "--config.rl.steps=4", *overrides, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert (
    "Resuming RL at step" in result.stdout and "was written on" not in result.stdout
  )  # same mesh
  # Lines before the resume come from the killed fresh run: fresh runs repeat exactly too.
  _assert_resumed_like(workdir, uninterrupted("8"), after=-1)


def test_sigterm_on_a_2x2x2_mesh_saves_and_resumes_exactly(uninterrupted, tmp_path, cli_env):
  process = _launch(
    tmp_path, "2x2x2", cli_env, "--config.rl.steps=4", "--config.checkpoint.every=100"
  )
  _wait_for(tmp_path / "metrics.jsonl", process)
  while '"step": 1,' not in (tmp_path / "metrics.jsonl").read_text():  # RL step 1 is logged
    assert process.poll() is None, process.stderr.read()[-3000:]
    time.sleep(0.02)
  process.send_signal(signal.SIGTERM)
  stdout, stderr = process.communicate(timeout=120)
  assert process.returncode == 0 and "SIGTERM: saved a checkpoint at RL step" in stdout, stderr[
    -3000:
  ]
  saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
  overrides, env = _on("2x2x2", cli_env)
  result = _train(tmp_path, "--config.rl.steps=4", *overrides, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Resuming RL at step" in result.stdout, (saved, stdout[-2000:], result.stdout[-2000:])
  assert 1 <= _resumed_at(result.stdout) < 4
  _assert_resumed_like(tmp_path, uninterrupted("2x2x2"), after=-1)


def test_a_2x2x2_mesh_trains_like_one_device(uninterrupted):
  """(data, fsdp, sequence, model) = (2, 2, 1, 2) gives one device's metrics (within 1e-4: sharded
  reductions change the summation order)."""
  import numpy as np

  train = lambda workdir: [line for line in _metrics(workdir) if "train/loss" in line]
  want, got = train(uninterrupted("1")), train(uninterrupted("2x2x2"))
  assert [line["step"] for line in got] == [line["step"] for line in want] and len(want) == 4
  for a, b in zip(want, got):
    for key in ("train/reward_mean", "train/loss", "train/kl", "train/entropy", "train/grad_norm"):
      np.testing.assert_allclose(
        b[key], a[key], rtol=1e-4, atol=1e-4, err_msg=f"{key} at {a['step']}"
      )


@pytest.mark.parametrize(
  "written,resumed,message",
  [
    ("8", "1", "Checkpoint 2 was written on 8 devices (data=8); resuming on 1 device."),
    (
      "1",
      "2x2x2",
      "Checkpoint 2 was written on 1 device; resuming on 8 devices (data=2, fsdp=2, model=2).",
    ),
  ],
)
def test_a_checkpoint_resumes_on_another_mesh(
  uninterrupted, tmp_path, cli_env, written, resumed, message
):
  workdir = _copy(uninterrupted(written), tmp_path)
  for step in (3, 4):  # as if stopped after checkpoint 2
    shutil.rmtree(workdir / "checkpoints" / str(step))
  overrides, env = _on(resumed, cli_env)
  result = _train(workdir, "--config.rl.steps=4", *overrides, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert message in result.stdout and _resumed_at(result.stdout) == 2, result.stdout[-3000:]
  _assert_resumed_like(workdir, uninterrupted(resumed), after=2)


def test_a_prompt_budget_that_drops_too_much_data_refuses_to_start(tmp_path):
  result = train_here(
    tmp_path,
    "--config.task.name=arithmetic",
    "--config.task.options={'max_digits': 5}",
    "--config.task.max_prompt_length=10",
  )
  assert result.returncode != 0
  assert "have prompts longer than max_prompt_length = 10 tokens" in result.stderr, result.stderr[
    -2000:
  ]
  assert "Traceback" not in result.stderr and not (tmp_path / "metrics.jsonl").exists()


def test_data_counts_and_truncation_are_logged(finished):
  first, *rl = _metrics(finished)
  assert first["step"] == 0 and first["data/test/evaluated"] == first["data/test/examples"] == 16
  assert first["data/train/dropped"] == 0 and first["data/train/examples"] == 64
  assert all(
    line["train/truncated"] == 0.0 for line in rl
  )  # key_token responses have a fixed length
