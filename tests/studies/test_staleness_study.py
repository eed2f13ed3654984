"""The staleness study: its smoke preset end to end, and the Student-t intervals it reports."""

import json
import subprocess
import sys

import numpy as np
import pytest

from studies.credit_study import report
from studies.staleness_study import configs
from studies.staleness_study import runner as staleness
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, cli_env):
  """The smoke preset through the study's CLI; its curves as run() returns them."""
  workdir = tmp_path_factory.mktemp("staleness")
  result = subprocess.run(
      [sys.executable, "-m", "studies.staleness_study", "--config",
       str(ROOT / "studies/staleness_study/configs.py:smoke"), "--workdir", str(workdir)],
      capture_output=True, text=True, cwd=ROOT, env=cli_env, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  curves = json.loads((workdir / "curves.json").read_text())
  for runs in curves.values():  # JSON keys: seed "0" -> 0
    for by_correction in runs.values():
      for correction, by_seed in by_correction.items():
        by_correction[correction] = {int(seed): curve for seed, curve in by_seed.items()}
  return configs.get_config("smoke"), workdir, curves


def test_smoke_study_measures_exact_success_of_every_arm_and_writes_the_report(smoke):
  study, workdir, curves = smoke
  assert sorted(staleness.arms(study)) == [
      (0, "grpo", "none"), (0, "oracle", "none"), (2, "grpo", "decoupled_ppo"),
      (2, "grpo", "none"), (2, "oracle", "decoupled_ppo"), (2, "oracle", "none")]
  runs = [curves[f"k{k}"][name][correction][0] for k, name, correction in staleness.arms(study)]
  for curve in runs:
    assert curve["updates"] == [0, 1, 2, 3]
    assert all(0.0 <= j <= 1.0 for j in curve["success"])
    assert curve["gen_tokens"][0] == 0 and np.all(np.diff(curve["gen_tokens"]) == 16 * 8)
  # Same seed, same initial policy: J before any update is one number across the arms.
  assert len({curve["success"][0] for curve in runs}) == 1
  assert len({tuple(curve["success"]) for curve in runs}) > 1  # and the arms then differ
  stale = [json.loads(line) for line in
           (workdir / "runs/k2/grpo/none/seed0/metrics.jsonl").read_text().splitlines()]
  assert [r["train/staleness_mean"] for r in stale if "train/loss" in r] == [0, 1, 2, 2]
  text = (workdir / "report.md").read_text()
  assert "## What staleness does to credit" in text
  assert "| oracle | decoupled_ppo | " in text and "(n/a)" in text  # one seed: no interval
  assert "grpo 384; oracle 384." in text  # 3 updates x 16 responses x 8 tokens
  assert curves.keys() == {"k0", "k2"}


def test_t_interval_matches_the_student_t_formula():
  mean, low, high = report.t_interval([1.0, 2.0, 3.0])
  # t_{0.975, 2} = 4.302653 (tables); s = 1, n = 3.
  assert mean == 2.0 and high - mean == pytest.approx(4.302653 / np.sqrt(3), rel=1e-6)
  assert mean - low == pytest.approx(high - mean)
  assert report.t_interval([0.5]) == (0.5, None, None)
  assert report.fmt_interval(0.5, None, None) == "0.500 (n/a)"
  assert report.fmt_interval(*report.t_interval([1.0, 1.0])) == "1.000 [1.000, 1.000]"
