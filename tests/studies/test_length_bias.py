"""Dr. GRPO's length bias on target_sum: the per-update lengths, the windows, and a smoke
run that writes the report and resumes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcredit.lab import batched, diagnostics
from studies.length_bias import configs
from studies.length_bias import runner as length_bias


def test_lengths_by_outcome_against_a_loop():
  rng = np.random.default_rng(0)
  mask = rng.uniform(size=(9, 7)) < 0.6
  rewards = (rng.uniform(size=9) < 0.4).astype(np.float32)
  lengths = mask.sum(1)
  want = [lengths[rewards == 1].mean(), lengths[rewards == 0].mean()]
  for fn in (diagnostics.lengths_by_outcome, jax.jit(diagnostics.lengths_by_outcome)):
    np.testing.assert_allclose(fn(jnp.asarray(mask), jnp.asarray(rewards)), want, rtol=1e-6)
  none_right = diagnostics.lengths_by_outcome(jnp.asarray(mask), jnp.zeros(9))
  np.testing.assert_allclose(none_right, [0.0, lengths.mean()], rtol=1e-6)


def test_start_and_end_weight_each_update_by_its_share():
  per_update = np.asarray([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
  weights = np.asarray([[1.0, 3.0, 0.0, 1.0], [0.0, 0.0, 2.0, 2.0]])
  start, end = length_bias.start_and_end(per_update, weights, fraction=0.5)
  np.testing.assert_allclose(start, [1.0, np.nan])
  np.testing.assert_allclose(end, [4.0, 7.5])


def test_smoke_run_reports_every_arm_and_resumes(tmp_path, monkeypatch):
  study = configs.get_config("smoke")
  results = length_bias.run(study, str(tmp_path))["smoke"]
  assert list(results) == ["grpo", "dr_grpo", "lambda_grpo_learned"]
  for result in results.values():
    assert result["success"].shape == (2, 3)
    defined = result["length_incorrect"][result["incorrect_share"] > 0]
    assert np.all((defined >= 1) & (defined <= 4))  # 1..n digits, then EOS; n = 3
  text = (tmp_path / "report.md").read_text()
  assert "## Regime `smoke`: target_sum {'n_digits': 3" in text
  assert "| grpo | grpo | seq-mean-token-mean | " in text
  assert "| dr_grpo | dr_grpo | seq-mean-token-sum-norm | " in text
  learnt = results["lambda_grpo_learned"]["length_preference_lam"]
  assert learnt.shape == (2, 4) and np.all(learnt[:, 0] == 0.0) and np.any(learnt[:, -1] != 0)
  assert "lambda_grpo_learned's learnt λ, per seed: at the first update 0.000, 0.000" in text
  assert "| dr_grpo | " in text.split("paired by seed")[-1]
  monkeypatch.setattr(batched.Runner, "train", lambda *a, **k: pytest.fail("retrained"))
  again = length_bias.run(study, str(tmp_path))["smoke"]
  np.testing.assert_array_equal(again["grpo"]["success"], results["grpo"]["success"])
