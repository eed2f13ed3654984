"""The training CLI end to end on a few steps (a smoke run, not a learning check)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent


def test_cli_runs_sft_and_rl_and_writes_metrics(tmp_path):
  overrides = [
      "--config.task.train_size=200", "--config.task.test_size=16",
      "--config.sft.max_steps=10", "--config.sft.batch_size=16", "--config.sft.eval_every=5",
      "--config.rl.steps=2", "--config.rl.prompts_per_step=4", "--config.rl.group_size=4",
      "--config.rl.eval_every=1",
  ]
  result = subprocess.run(
      [sys.executable, "-m", "jaxcredit.train", "--config", str(ROOT / "experiments/quickstart.py"),
       "--workdir", str(tmp_path), *overrides],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert all("step" in line for line in lines)
  train = [line for line in lines if "train/reward_mean" in line]
  assert len(train) == 2
  for key in ("train/loss", "train/entropy", "train/tokens_per_sec", "train/policy/approx_kl",
              "train/zero_variance_groups", "eval/accuracy"):
    assert key in train[-1], key
  assert abs(train[0]["train/policy/ratio_mean"] - 1.0) < 1e-4  # sampler and learner agree
  assert json.loads((tmp_path / "config.json").read_text())["rl"]["group_size"] == 4


def test_metrics_writer_keeps_an_earlier_run(tmp_path):
  from jaxcredit.train.loop import MetricsWriter

  MetricsWriter(tmp_path).write(0, {"eval/accuracy": 0.5})
  MetricsWriter(tmp_path).write(0, {"eval/accuracy": 0.25})
  files = sorted(p.name for p in tmp_path.glob("metrics*.jsonl"))
  assert len(files) == 2 and "metrics.jsonl" in files
  assert json.loads((tmp_path / "metrics.jsonl").read_text())["eval/accuracy"] == 0.25
