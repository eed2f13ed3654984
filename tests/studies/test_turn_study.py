"""The turn study: its smoke preset end to end, the exact turn oracle as the `oracle` arm's
provider, and the equal-token summaries."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from studies.turn_study import runner as turn_study
from tests.conftest import ROOT


def _study(tmp_path, cli_env, *overrides):
  return subprocess.run(
      [sys.executable, "-m", "studies.turn_study", "--config",
       str(ROOT / "studies/turn_study/configs.py:smoke"), "--workdir", str(tmp_path), *overrides],
      capture_output=True, text=True, cwd=ROOT, env=cli_env, timeout=600, check=False)


def test_smoke_study_measures_every_arm_charges_continuations_and_resumes(tmp_path, cli_env):
  """One regime of the preset's two trained (the other is listed as not run); a rerun
  trains nothing."""
  result = _study(tmp_path, cli_env, "--config.run_regimes=('four_turns',)")
  assert result.returncode == 0, result.stderr[-3000:]
  curves = json.loads((tmp_path / "curves.json").read_text())
  assert sorted(curves) == ["four_turns"]
  report = (tmp_path / "report.md").read_text()
  assert "Regimes of the preset not run here: eight_turns (`run_regimes`)." in report
  regime, turns = "four_turns", 4
  assert sorted(curves[regime]) == ["grpo", "turn_baseline"]
  tokens = {name: runs["0"]["gen_tokens"] for name, runs in curves[regime].items()}
  assert tokens["grpo"] == [0, 8 * turns]  # 8 episodes x one action per turn
  assert tokens["turn_baseline"][-1] > 4 * tokens["grpo"][-1]  # 4 continuations per turn
  for runs in curves[regime].values():
    assert all(0.0 <= j <= 1.0 for j in runs["0"]["success"])
    assert len(runs["0"]["success"]) == 2
    # Each arm's credit is scored per turn on its own batches, at every measurement.
    assert len(runs["0"]["turn_scores"]["dm_oracle"]) == 2
  section = report.split(f"## {regime}: key_turns ")[1].split("\n## ")[0]
  assert all(f"| {name} |" in section for name in curves[regime])
  assert "### Each arm's credit against the exact turn credit, per turn" in section
  assert f"| r at turn {turns - 1} |" in section
  # Every run is finished: nothing is trained again.
  again = _study(tmp_path, cli_env, "--config.run_regimes=('four_turns',)")
  assert again.returncode == 0 and "[turn study]" in again.stdout
  assert ": grpo seed" not in again.stdout


def test_summaries_compare_at_equal_tokens():
  """J linear in log10 tokens; the costly arm's first measurement comes after the budget's
  start, so it holds its initial J until then."""
  updates = [0, 1, 2, 3]
  cheap = {"gen_tokens": [0, 10, 100, 1000], "success": [0.0, 0.1, 0.2, 0.3], "updates": updates}
  costly = {"gen_tokens": [0, 100, 1000, 10000], "success": [0.0, 0.5, 0.6, 0.7],
            "updates": updates}
  table, budget, low = turn_study.summaries({"grpo": {0: cheap}, "turn_baseline": {0: costly}})
  assert (budget, low) == (1000, 10)
  assert table["J at the budget"] == {"grpo": {0: pytest.approx(0.3)},
                                      "turn_baseline": {0: pytest.approx(0.6)}}
  # Mean over log10 tokens on [10, 1000]: cheap rises 0.1 -> 0.3 (mean 0.2); costly holds 0
  # on [10, 100] then rises 0.5 -> 0.6 on [100, 1000] (mean (0.25 + 0.55) / 2 = 0.4).
  assert table["mean J over log tokens"]["grpo"][0] == pytest.approx(0.2, abs=2e-3)
  assert table["mean J over log tokens"]["turn_baseline"][0] == pytest.approx(0.4, abs=2e-3)
  # At equal updates (the middle measurement) the costly arm's extra tokens are free.
  assert table["J after 2 updates"] == {"grpo": {0: 0.2}, "turn_baseline": {0: 0.6}}


def _key_turns_batch(tmp_path, rows=8):
  """(task, model, examples, rollout): episodes of a random 1-layer policy on key_turns."""
  import ml_collections
  from flax import nnx

  from jaxcredit import tasks
  from jaxcredit.models import Transformer, preset

  config = ml_collections.ConfigDict({"name": "key_turns", "options": {}, "train_size": rows,
                                      "test_size": 4})
  task = tasks.make(config, data_dir=str(tmp_path), seed=0)
  model = Transformer(preset("tiny", vocab_size=task.vocab_size, n_layers=1), rngs=nnx.Rngs(0))
  examples = [task.sources["train"][i] for i in range(rows)]
  batch = {"prompts": np.stack([e["prompt"] for e in examples]),
           "prompt_valid": np.ones((rows, 2), bool), "examples": examples}
  return task, model, examples, tasks.multi_turn_source(task)(model, batch, jax.random.key(0))


def test_per_turn_reduces_each_turns_action_tokens():
  x = np.asarray([[9.0, 1.0, 2.0, 9.0, 3.0, 5.0], [9.0, 4.0, 9.0, 9.0, 6.0, 9.0]])
  turn_ids = np.asarray([[-1, 0, 0, 1, 1, 1], [-1, 0, 0, 0, 1, -1]])
  mask = np.asarray([[0, 1, 1, 0, 1, 1], [0, 1, 0, 0, 1, 0]], bool)  # observations: 0
  np.testing.assert_array_equal(turn_study.per_turn(x, turn_ids, mask, 3),
                                [[1.5, 4.0, 0.0], [4.0, 6.0, 0.0]])
  np.testing.assert_array_equal(turn_study.per_turn(x, turn_ids, mask, 2, reduce=np.sum),
                                [[3.0, 8.0], [4.0, 6.0]])


def test_turn_scores_put_the_oracle_at_one_and_measure_grpo_against_the_exact_credit(tmp_path):
  from jaxcredit import estimators
  from jaxcredit.credit import extras
  from jaxcredit.lab import providers
  from jaxcredit.tasks import key_turns

  task, model, examples, rollout = _key_turns_batch(tmp_path, rows=16)
  rollout = rollout.replace(group_size=4)
  oracle_extras, _ = providers.exact_credit(model, task, rollout, examples)
  rollout = rollout.replace(extras={**rollout.extras, **oracle_extras})
  context = extras.Context(task, model, examples, jax.random.key(1), 6)
  _, oracle = turn_study.turn_score_hook({"name": "oracle"}, every=3)(context, rollout)
  for name in ("r_pool", "r_within"):
    assert oracle[f"turn_score/{name}"] == pytest.approx(1.0)
  # The random policy's credit is below sign agreement's floor (|A| > 0.01): undefined.
  assert "turn_score/sa" not in oracle
  assert oracle["turn_score/dm"] == pytest.approx(oracle["turn_score/dm_oracle"])
  # The random policy never succeeds; GRPO reads the rewards only, so random ones give its
  # credit spread to score (the exact credit is that of the sampled tokens, unchanged).
  rollout = rollout.replace(rewards=jax.numpy.asarray(np.random.default_rng(0).random(16),
                                                      jax.numpy.float32))
  _, grpo = turn_study.turn_score_hook({"name": "grpo"}, every=3)(context, rollout)
  # Against an independent reading: every turn of an episode gets its group-normalised reward.
  _, credit = key_turns.oracle.turn_credit(model, task.config, rollout.tokens, rollout.token_valid)
  exact = credit[np.asarray(rollout.mask, bool)].reshape(16, 4)
  mine = np.asarray(estimators.get("grpo")(rollout).advantages)[:, -1:].repeat(4, 1)
  assert grpo["turn_score/r_pool"] == pytest.approx(np.corrcoef(mine.ravel(), exact.ravel())[0, 1])
  for k in range(4):
    if np.ptp(exact[:, k]) > 0:
      assert grpo[f"turn_score/r_turn{k}"] == pytest.approx(
          np.corrcoef(mine[:, k], exact[:, k])[0, 1])
  assert "turn_score/r_within" not in grpo  # no spread within an episode: undefined, not 0
  assert grpo["turn_score/dm"] == pytest.approx(0.5)  # equal credit on 2 decisive of 4 turns
  # Between measurements the hook does nothing.
  assert turn_study.turn_score_hook({"name": "grpo"}, every=4)(context, rollout) == ({}, {})


def test_the_oracle_provider_gives_exact_turn_credit_on_key_turns(tmp_path):
  from jaxcredit.lab import providers
  from jaxcredit.tasks import key_turns

  task, model, examples, rollout = _key_turns_batch(tmp_path)
  extras, _ = providers.exact_credit(model, task, rollout, examples)
  values, credit = key_turns.oracle.turn_credit(model, task.config, rollout.tokens,
                                                rollout.token_valid)
  mask = np.asarray(rollout.mask)
  np.testing.assert_array_equal(extras["oracle_advantages"], credit.astype(np.float32))
  np.testing.assert_allclose(extras["oracle_values"][mask].reshape(8, 4), values[:, :4],
                             rtol=1e-6)
  np.testing.assert_allclose(credit.sum(axis=1), np.asarray(rollout.rewards) - values[:, 0],
                             atol=1e-9)


def test_the_along_turns_preset_keeps_the_decisive_turns_and_hides_the_rest():
  from jaxcredit.tasks import key_turns
  from studies.turn_study import configs

  study = configs.get_config("along_turns")
  assert list(study.regimes) == ["turns_004", "turns_016", "turns_064", "turns_256"]
  for regime, n in zip(study.regimes, (4, 16, 64, 256)):
    options = turn_study.train_config(study, regime, "grpo", 0, "/unused").task.options
    config = key_turns.KeyTurnsConfig(**options.to_dict())
    assert (config.n_turns, config.decisive, config.hidden_actions) == (n, (1, 3), True)


def test_the_baseline_check_measures_every_turn_and_reports_the_z_scores():
  """Six turns, decisive first and last: finite per-turn advantages and baseline errors
  (b_k - V(h_k), both in [0, 1]) for every turn of sampled episodes, and the report's
  z-scores as NumPy computes them, a biased turn standing out."""
  from studies.turn_study import baseline_check
  from jaxcredit.tasks import key_turns

  config = key_turns.KeyTurnsConfig(n_turns=6, decisive=(0, 5), hidden_actions=True)
  model = baseline_check.leaning_policy(0)
  advantages, errors, generated = baseline_check.turn_advantages(model, config, 8, 2, seed=0)
  assert advantages.shape == errors.shape == (8, 6) and generated > 0
  assert np.isfinite(advantages).all() and np.abs(errors).max() <= 1.0
  rng = np.random.default_rng(0)
  errors = rng.normal(size=(50, 6)) + np.asarray([0, 0, 0, 0, 0, 3.0])  # turn 5 biased
  shared = rng.normal(size=(50, 1)) + 0 * errors  # A_k: one value per episode
  text = baseline_check.report(shared, errors, config, "# header")
  z = errors.mean(0) / (errors.std(0, ddof=1) / np.sqrt(50))
  assert f"| b_k - V(h_k): turns with abs z > 3 (expected 0.0) | {np.sum(np.abs(z) > 3)} |" in text
  assert np.abs(z[5]) > 3 > np.abs(z[:5]).max() and f"| {z[5]:+.2f} |" in text
  episode_z = shared.mean() / (shared[:, 0].std(ddof=1) / np.sqrt(50))
  assert f"(each episode's mean A over its turns) | {episode_z:+.2f} |" in text
  assert f"| 5 | {shared[:, 0].mean():+.4f} |" in text
