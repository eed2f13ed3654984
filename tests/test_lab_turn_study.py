"""The turn study: its smoke preset end to end, the exact turn oracle as the `oracle` arm's
provider, and the equal-token summaries."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxcredit.lab import turn_study
from tests.conftest import ROOT


def _study(tmp_path, cli_env):
  return subprocess.run(
      [sys.executable, "-m", "jaxcredit.lab.turn_study", "--config",
       str(ROOT / "experiments/turn_study.py:smoke"), "--workdir", str(tmp_path)],
      capture_output=True, text=True, cwd=ROOT, env=cli_env, timeout=600, check=False)


def test_smoke_study_measures_every_arm_charges_continuations_and_resumes(tmp_path, cli_env):
  result = _study(tmp_path, cli_env)
  assert result.returncode == 0, result.stderr[-3000:]
  curves = json.loads((tmp_path / "curves.json").read_text())
  assert sorted(curves) == ["grpo", "turn_baseline"]
  tokens = {name: runs["0"]["gen_tokens"] for name, runs in curves.items()}
  assert tokens["grpo"] == [0, 32, 64]  # 8 episodes x 4 actions per update
  assert tokens["turn_baseline"][-1] > 4 * tokens["grpo"][-1]  # 4 continuations per turn
  for runs in curves.values():
    assert all(0.0 <= j <= 1.0 for j in runs["0"]["success"]) and len(runs["0"]["success"]) == 3
  report = (tmp_path / "report.md").read_text()
  assert all(f"| {name} |" in report for name in curves)
  again = _study(tmp_path, cli_env)  # every run is finished: nothing is trained again
  assert again.returncode == 0 and "[turn study] grpo" not in again.stdout


def test_summaries_compare_at_equal_tokens():
  """J linear in log10 tokens; the costly arm's first measurement comes after the budget's
  start, so it holds its initial J until then."""
  cheap = {"gen_tokens": [0, 10, 100, 1000], "success": [0.0, 0.1, 0.2, 0.3]}
  costly = {"gen_tokens": [0, 100, 1000, 10000], "success": [0.0, 0.5, 0.6, 0.7]}
  table, budget, low = turn_study.summaries({"grpo": {0: cheap}, "turn_baseline": {0: costly}})
  assert (budget, low) == (1000, 10)
  assert table["J at the budget"] == {"grpo": {0: pytest.approx(0.3)},
                                      "turn_baseline": {0: pytest.approx(0.6)}}
  # Mean over log10 tokens on [10, 1000]: cheap rises 0.1 -> 0.3 (mean 0.2); costly holds 0
  # on [10, 100] then rises 0.5 -> 0.6 on [100, 1000] (mean (0.25 + 0.55) / 2 = 0.4).
  assert table["mean J over log tokens"]["grpo"][0] == pytest.approx(0.2, abs=2e-3)
  assert table["mean J over log tokens"]["turn_baseline"][0] == pytest.approx(0.4, abs=2e-3)


def test_the_oracle_provider_gives_exact_turn_credit_on_key_turns(tmp_path):
  import ml_collections

  from flax import nnx

  from jaxcredit.lab import providers, turn_oracle
  from jaxcredit.models import Transformer, preset
  from jaxcredit.train import tasks

  config = ml_collections.ConfigDict({"name": "key_turns", "options": {}, "train_size": 8,
                                      "test_size": 4})
  task = tasks.make(config, data_dir=str(tmp_path), seed=0)
  model = Transformer(preset("tiny", vocab_size=task.vocab_size, n_layers=1), rngs=nnx.Rngs(0))
  examples = [task.sources["train"][i] for i in range(8)]
  batch = {"prompts": np.stack([e["prompt"] for e in examples]),
           "prompt_valid": np.ones((8, 2), bool), "examples": examples}
  rollout = tasks.multi_turn_source(task)(model, batch, jax.random.key(0))
  extras, _ = providers.exact_credit(model, task, rollout, examples)
  values, credit = turn_oracle.turn_credit(model, task.config, rollout.tokens, rollout.token_valid)
  mask = np.asarray(rollout.mask)
  np.testing.assert_array_equal(extras["oracle_advantages"], credit.astype(np.float32))
  np.testing.assert_allclose(extras["oracle_values"][mask].reshape(8, 4), values[:, :4],
                             rtol=1e-6)
  np.testing.assert_allclose(credit.sum(axis=1), np.asarray(rollout.rewards) - values[:, 0],
                             atol=1e-9)
