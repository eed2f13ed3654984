"""The credit study: report helpers, run configs, and a smoke run that writes the report."""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from jaxcredit.lab import exact_metrics
from jaxcredit.view import __main__ as view_cli
from studies.credit_study import configs_v1, report
from studies.credit_study import runner as study
from tests.conftest import ROOT, load_experiment


def test_pass_at_k_is_the_chance_that_k_samples_hold_a_success():
  """Against sampling: k Bernoulli(p(x)) draws per prompt, 200,000 times."""
  rng = np.random.default_rng(0)
  success = np.array([0.0, 0.05, 0.3, 0.9, 1.0])
  for k in (1, 4, 16):
    draws = rng.random((200_000, len(success), k)) < success[:, None]
    sampled = draws.any(axis=2).mean()
    se = np.sqrt(sampled * (1 - sampled) / 200_000)
    assert abs(exact_metrics.pass_at_k(success, k) - sampled) < 5 * se + 1e-12, k
  assert exact_metrics.pass_at_k(success, 1) == pytest.approx(success.mean())


def test_tokens_to_reach_and_auc_over_log_tokens():
  tokens, success = [0, 100, 1000, 10000], [0.1, 0.2, 0.6, 0.8]
  # 0.4 lies halfway from 0.2 to 0.6 in log10 tokens: 10^2.5.
  assert exact_metrics.tokens_to_reach(tokens, success, 0.4) == pytest.approx(10**2.5)
  assert exact_metrics.tokens_to_reach(tokens, success, 0.1) == 0
  assert exact_metrics.tokens_to_reach(tokens, success, 0.9) is None
  assert exact_metrics.auc_log_tokens(tokens, [0.5] * 4, 100, 10000) == pytest.approx(0.5)
  # Linear in log tokens from (2, 0.2) to (3, 0.6) then (4, 0.8): mean of the two trapezoids.
  assert exact_metrics.auc_log_tokens(tokens, success, 100, 10000) == pytest.approx(
      (0.4 + 0.7) / 2, abs=1e-3)
  # Held at its last value beyond its last measurement.
  assert exact_metrics.auc_log_tokens([0, 100, 1000], [0, 0.2, 0.6], 100, 10000) == pytest.approx(
      (0.4 + 0.6) / 2, abs=1e-3)


def test_intervals_are_n_a_below_five_seeds():
  rng = np.random.default_rng(0)
  assert report.ci_text([0.2, 0.4, 0.6, 0.8], rng, 100) == "0.500 (n/a)"
  text = report.ci_text([0.2, 0.4, 0.6, 0.8, 0.5], rng, 2000)
  low, high = map(float, re.findall(r"\[(\S+), (\S+)\]", text)[0])
  assert text.startswith("0.500 [") and low < 0.5 < high and (low, high) != (0.2, 0.8)


def test_the_efficiency_table_gives_the_interquartile_mean_of_the_finals():
  """IQM: the mean of the middle half of the sorted per-seed finals (two stalled seeds of
  ten barely move it)."""
  finals = np.random.default_rng(1).uniform(0.8, 1.0, 10)
  finals[[2, 7]] = 0.06
  curve = lambda f: {"final": f, "pass@k": {"16": f}, "auc": f, "tau": None,
                     "zero_variance_groups": 0.0, "gen_tokens": 100}
  summary = {"grpo": {seed: curve(f) for seed, f in enumerate(finals)}}
  row = report.efficiency_table(summary, 0.9, np.random.default_rng(0), 100)[2].split(" | ")
  assert float(row[2]) == pytest.approx(np.mean(np.sort(finals)[2:8]), abs=5e-4)


def test_study_run_configs_are_scale_matched_and_seeded():
  config = configs_v1.get_config("small")
  run = study.train_config(config, "key_token", "ppo_gae", 2, "/tmp/data")
  assert run.seed == 2 and run.task.data_dir == "/tmp/data"
  assert run.advantage.to_dict() == {"scale": "rms", "of": {"name": "gae", "lam": 0.95}}
  assert run.critic.preset == run.model.preset
  assert study.train_config(config, "key_token", "grpo", 0, "/tmp/data").critic.preset is None
  assert list(config.tasks) == ["key_token"]
  with pytest.raises(ValueError, match="Unknown preset 'huge'"):
    configs_v1.get_config("huge")


def test_smoke_study_writes_the_report(tmp_path):
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "studies.credit_study",
      "--config",
      str(ROOT / "studies/credit_study/configs_v1.py:smoke"),
      "--workdir",
      str(tmp_path),
    ],
    capture_output=True,
    text=True,
    cwd=ROOT,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  text = (tmp_path / "report.md").read_text()
  for heading in (
    "## Sample efficiency: key_token",
    "## Oracle agreement",
    "## Monte-Carlo values vs exact values",
    "## Credit viewer",
  ):
    assert heading in text
  assert "arithmetic" not in text  # not part of the study
  # One seed: every interval is n/a, never a zero-width range.
  table = [line for line in text.splitlines() if line.startswith("| grpo | ")][0]
  assert "(n/a)" in table and not re.search(r"\[(\S+), \1\]", text)
  scores = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
  assert {s["estimator"] for s in scores} == {"oracle", "grpo", "vineppo"}
  oracle_rows = [s for s in scores if s["estimator"] == "oracle"]
  assert all(s["r_pool"]["value"] == pytest.approx(1.0) for s in oracle_rows)
  assert all(
    s["rcn"]["defined"] and s["rcn"]["value"] == 0.0 for s in oracle_rows
  )  # exact: no resampling noise
  grpo = [s for s in scores if s["estimator"] == "grpo"]
  # A constant-per-response credit explains no within-response credit and cannot beat the ceiling.
  assert all(
    s["r2_within"]["value"] == 0.0 and s["r_pool"]["value"] <= s["ceiling"]["value"] + 1e-9
    for s in grpo
  )
  table = (tmp_path / "scores.csv").read_text().splitlines()
  assert (
    table[0].startswith("task,step,estimator,gen_tokens,r_pool") and len(table) == len(scores) + 1
  )
  checks = [json.loads(line) for line in (tmp_path / "mc_check.jsonl").read_text().splitlines()]
  assert checks and all(c["telescoping_error"] < 1e-5 for c in checks)
  for figure in ("learning_curves_key_token.png", "credit_heatmap.png"):
    assert (tmp_path / figure).exists(), figure
  curves = json.loads((tmp_path / "curves.json").read_text())["curves"]
  assert set(curves) == {"key_token"} and set(curves["key_token"]) == {"grpo", "vineppo", "oracle"}
  for curve in (c for runs in curves["key_token"].values() for c in runs.values()):
    # Exact J(pi) before updates 0, 2, 4 (the same initial policy for every estimator), with
    # pass@k at least J and growing with k.
    assert curve["updates"] == [0, 2, 4] and curve["gen_tokens"][0] == 0
    assert curve["success"][0] == curves["key_token"]["grpo"]["0"]["success"][0]
    passes = [curve["pass@k"][k][-1] for k in ("1", "4", "16", "64")]
    assert passes[0] == pytest.approx(curve["success"][-1]) and passes == sorted(passes)
    assert 0 <= curve["zero_variance_groups"] <= 1
  # Each cell's per-token export, linked from the report; the viewer writes the linked pages.
  links = re.findall(r"\]\((runs/[^)]+/credit\.html)\)", text)
  assert sorted(links) == [
    f"runs/{cell}/seed0/credit.html"
    for cell in ("key_token/grpo", "key_token/oracle", "key_token/vineppo")
  ]
  assert view_cli.main([str(tmp_path)]) == 0
  assert all((tmp_path / link).exists() for link in links)


def test_read_curve_pairs_each_measurement_with_the_tokens_generated_before_it(tmp_path):
  hooked = lambda j, p: {"train/hook/exact_success": j, "train/hook/exact_pass@4": p}
  lines = [
    {"step": 0, "eval/accuracy": 0.0},
    {"step": 1, "train/gen_tokens": 50, "train/zero_variance_groups": 0.5, **hooked(0.1, 0.3)},
    {"step": 2, "train/gen_tokens": 100, "train/zero_variance_groups": 0.25},
    {"step": 3, "train/gen_tokens": 150, "train/zero_variance_groups": 0.0, **hooked(0.4, 0.7)},
  ]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
  assert exact_metrics.read_curve(tmp_path) == {
    "updates": [0, 2],
    "success": [0.1, 0.4],
    "pass@k": {"4": [0.3, 0.7]},
    "gen_tokens": [0, 100],
    "zero_variance_groups": 0.25,
  }


def test_a_signalled_run_stops_the_study_unfinished_and_a_rerun_completes_it(tmp_path):
  """SIGTERM during a study's run: the run saves a checkpoint and is not marked finished,
  the study stops (RunStopped) instead of going on, and a rerun resumes it to its end."""
  config = load_experiment("quickstart")
  config.task.name, config.task.options = "key_token", {"length": 10, "n_keys": 4}
  config.task.train_size, config.task.test_size, config.sft.max_steps = 64, 16, 0
  config.rl.prompts_per_step, config.rl.group_size, config.rl.steps = 4, 4, 3
  config.rl.eval_every, config.checkpoint.every = 100, 100

  def preempt_during_the_second_update(context, rollout):
    del rollout
    if context.rl_step == 1:
      os.kill(os.getpid(), signal.SIGTERM)  # what a preemption sends; loop.run handles it
    return {}, {}

  run_dir = tmp_path / "run"
  with pytest.raises(study.RunStopped, match="tiny was stopped at step 2; rerun the study"):
    study.train_once(config, run_dir, preempt_during_the_second_update, "tiny")
  assert not (run_dir / "wall_seconds.json").exists()
  first_part = json.loads((run_dir / "wall_seconds_partial.json").read_text())
  seconds = study.train_once(config, run_dir, None, "tiny")
  steps = [
    json.loads(line)["step"]
    for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    if "train/loss" in line
  ]
  assert steps == [1, 2, 3]  # the rerun went on from the checkpoint at step 2
  assert seconds > first_part and json.loads((run_dir / "wall_seconds.json").read_text()) == seconds
  assert study.train_once(config, run_dir, None, "tiny") == seconds  # finished: not trained again
