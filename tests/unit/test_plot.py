"""python -m jaxcredit.plot: help, a missing metric, the SFT/RL marker, smoothing."""

import json
import subprocess
import sys

import numpy as np
import pytest

from jaxcredit import plot


def _run_dir(path, sft_steps=20, rl_steps=30):
  path.mkdir()
  records = [{"step": 0, "eval/accuracy": 0.0}]
  records += [
    {"step": s, "sft/loss": 1.0 / s, "eval/accuracy": 0.01 * s}
    for s in range(10, sft_steps + 1, 10)
  ]
  records += [
    {"step": sft_steps + k, "train/reward_mean": float(k % 3), "eval/accuracy": 0.2 + 0.01 * k}
    for k in range(1, rl_steps + 1)
  ]
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  return path


def test_help_explains_every_option():
  result = subprocess.run(
    [sys.executable, "-m", "jaxcredit.plot", "--help"], capture_output=True, text=True, check=True
  )
  for option in ("--metric", "--out", "--smooth", "--title", "run directories"):
    assert option in result.stdout


def test_a_missing_metric_lists_the_available_ones(tmp_path):
  run = _run_dir(tmp_path / "grpo")
  with pytest.raises(
    ValueError,
    match=r"has no 'train/loss' entries; it has: eval/accuracy, sft/loss, "
    r"train/reward_mean\.",
  ):
    plot.read_metric(run, "train/loss")


def test_rl_start_is_the_last_sft_step(tmp_path):
  assert plot.rl_start(_run_dir(tmp_path / "with_sft", sft_steps=20)) == 20
  assert plot.rl_start(_run_dir(tmp_path / "no_sft", sft_steps=0)) is None


def test_smoothing_is_a_debiased_exponential_average():
  values = np.random.default_rng(0).normal(size=12)
  weight = 0.6
  want = [
    sum((1 - weight) * weight ** (t - i) * values[i] for i in range(t + 1))
    / (1 - weight ** (t + 1))
    for t in range(len(values))
  ]
  np.testing.assert_allclose(plot.smooth(list(values), weight), want, rtol=1e-12)
  np.testing.assert_array_equal(plot.smooth(list(values), 0.0), values)
  with pytest.raises(ValueError, match=r"--smooth must be in \[0, 1\)"):
    plot.smooth([1.0], 1.0)


def test_plot_marks_rl_and_writes_a_png(tmp_path):
  runs = [_run_dir(tmp_path / "grpo"), _run_dir(tmp_path / "rloo", sft_steps=10)]
  out = tmp_path / "curves.png"
  plot.main(
    [
      *map(str, runs),
      "--metric",
      "train/reward_mean",
      "--smooth",
      "0.6",
      "--title",
      "reward",
      "--out",
      str(out),
    ]
  )
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
