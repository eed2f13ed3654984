"""The credit study: report helpers, run configs, and a smoke run that writes the report."""

import json
import re
import runpy
import subprocess
import sys

import numpy as np
import pytest

from jaxcredit.lab import report, study
from jaxcredit.view import __main__ as view_cli
from tests.conftest import ROOT


def load_experiment_with_preset(preset):
  return runpy.run_path(str(ROOT / "experiments/credit_study.py"))["get_config"](preset)


def test_auc_and_steps_to_threshold():
  assert report.auc([0, 10, 20], [0.0, 1.0, 1.0], 20) == pytest.approx(0.75)
  assert report.auc([0, 10], [0.0, 1.0], 20) == pytest.approx(0.75)  # held flat after the last eval
  assert report.steps_to_threshold([0, 10, 20], [0.0, 0.5, 1.0], 0.9) == pytest.approx(18.0)
  assert report.steps_to_threshold([0, 10], [0.0, 0.5], 0.9) is None


def test_bootstrap_ci_contains_the_mean_and_narrows_with_agreement():
  rng = np.random.default_rng(0)
  mean, low, high = report.bootstrap_ci([0.2, 0.4, 0.6, 0.8], rng, 2000)
  assert mean == pytest.approx(0.5) and low < mean < high
  assert report.bootstrap_ci([0.5, 0.5, 0.5], rng, 100) == (0.5, 0.5, 0.5)


def test_study_run_configs_are_scale_matched_and_seeded():
  config = load_experiment_with_preset("small")
  run = study.train_config(config, "key_token", "ppo_gae", 2, "/tmp/data")
  assert run.seed == 2 and run.task.data_dir == "/tmp/data"
  assert run.advantage.to_dict() == {"scale": "rms", "of": {"name": "gae", "lam": 0.95}}
  assert run.critic.preset == run.model.preset
  assert study.train_config(config, "arithmetic", "grpo", 0, "/tmp/data").critic.preset is None
  with pytest.raises(ValueError, match="Unknown preset 'huge'"):
    load_experiment_with_preset("huge")


def test_smoke_study_writes_the_report(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "jaxcredit.lab.study", "--config", str(ROOT / "experiments/credit_study.py:smoke"),
       "--workdir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  text = (tmp_path / "report.md").read_text()
  for heading in ("## Sample efficiency: key_token", "## Sample efficiency: arithmetic", "## Oracle agreement",
                  "## Monte-Carlo values vs exact values"):
    assert heading in text
  scores = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
  assert {s["estimator"] for s in scores} == {"oracle", "grpo", "vineppo"}
  oracle_rows = [s for s in scores if s["estimator"] == "oracle"]
  assert all(s["r_pool"]["value"] == pytest.approx(1.0) for s in oracle_rows)
  assert all(s["rcn"]["defined"] and s["rcn"]["value"] == 0.0 for s in oracle_rows)  # exact: no resampling noise
  grpo = [s for s in scores if s["estimator"] == "grpo"]
  # A constant-per-response credit explains no within-response credit and cannot beat the ceiling.
  assert all(s["r2_within"]["value"] == 0.0 and s["r_pool"]["value"] <= s["ceiling"]["value"] + 1e-9 for s in grpo)
  table = (tmp_path / "scores.csv").read_text().splitlines()
  assert table[0].startswith("task,step,estimator,gen_tokens,r_pool") and len(table) == len(scores) + 1
  checks = [json.loads(line) for line in (tmp_path / "mc_check.jsonl").read_text().splitlines()]
  assert checks and all(c["telescoping_error"] < 1e-5 for c in checks)
  for figure in ("learning_curves_key_token.png", "learning_curves_arithmetic.png", "credit_heatmap.png"):
    assert (tmp_path / figure).exists(), figure
  curves = json.loads((tmp_path / "curves.json").read_text())["curves"]
  assert set(curves["key_token"]) == {"grpo", "vineppo", "oracle"} and set(curves["arithmetic"]) == {"grpo"}
  # Each cell's per-token export, linked from the report; the viewer writes the linked pages.
  links = re.findall(r"\]\((runs/[^)]+/credit\.html)\)", text)
  assert sorted(links) == [f"runs/{cell}/seed0/credit.html"
                           for cell in ("arithmetic/grpo", "key_token/grpo", "key_token/oracle", "key_token/vineppo")]
  assert view_cli.main([str(tmp_path)]) == 0
  assert all((tmp_path / link).exists() for link in links)


def test_read_curve_starts_at_the_policy_rl_starts_from(tmp_path):
  lines = [{"step": 0, "eval/accuracy": 0.0}, {"step": 20, "sft/loss": 1.0, "eval/accuracy": 0.3},
           {"step": 21, "train/reward_mean": 0.2, "train/gen_tokens": 50},
           {"step": 22, "train/reward_mean": 0.4, "train/gen_tokens": 100, "eval/accuracy": 0.5}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
  assert study.read_curve(tmp_path) == {"step": [0, 2], "accuracy": [0.3, 0.5], "gen_tokens": [0, 100]}
