"""The mechanism's forecast: its integral, its outcome measure, and a smoke run that measures,
calibrates, predicts and resumes."""

import functools
import json

import numpy as np
import pytest

from jaxcredit.lab import exact_metrics
from studies.credit_study import configs, forecast, sweep


def _point(success, gradient_norm, projection, signal, trace, seeds=2):
  arms = len(projection)
  return {"success": [success] * seeds, "gradient_norm": [gradient_norm] * seeds,
          "projection": [list(projection)] * seeds, "signal": [[signal] * arms] * seeds,
          "trace": [[trace] * arms] * seeds}


def test_updates_to_integrates_dj_over_the_efficiency():
  # s = |grad J| projection / sqrt(signal + trace / B) = 2 * 1 / sqrt(0 + 8 / 8) = 2, then 4.
  flat = [_point(0.1, 2.0, [1.0, 0.5], 0.0, 8.0), _point(0.5, 2.0, [1.0, 0.5], 0.0, 8.0)]
  np.testing.assert_allclose(forecast.updates_to(0.9, flat, 8), [0.8 / 2, 0.8 / 1], rtol=1e-6)
  # Linear in J between the points, held beyond: s = 2 + 5 (J - 0.1) up to 0.5, then 4.
  rising = [_point(0.1, 2.0, [1.0], 0.0, 8.0), _point(0.5, 4.0, [1.0], 0.0, 8.0)]
  want = np.log(4 / 2) / 5 + 0.4 / 4
  np.testing.assert_allclose(forecast.updates_to(0.9, rising, 8), [want], rtol=1e-4)
  # The points' order does not matter; an arm pointing away never arrives; J at the level: 0.
  np.testing.assert_allclose(forecast.updates_to(0.9, rising[::-1][::-1], 8), [want], rtol=1e-4)
  away = [_point(0.1, 2.0, [1.0, -0.1], 0.0, 8.0), _point(0.5, 2.0, [1.0, 0.3], 0.0, 8.0)]
  assert np.isinf(forecast.updates_to(0.9, away, 8)[1])
  np.testing.assert_array_equal(forecast.updates_to(0.9, [_point(0.95, 1, [1], 0, 1)], 8), [0])
  # Noise: signal 1, trace 8 over B = 8 groups: the step's length doubles its sqrt.
  noisy = [_point(0.1, 2.0, [1.0], 1.0, 8.0), _point(0.5, 2.0, [1.0], 1.0, 8.0)]
  np.testing.assert_allclose(forecast.updates_to(0.9, noisy, 8), [0.8 * np.sqrt(2) / 2],
                             rtol=1e-6)


def test_each_seed_is_predicted_alone_and_censored_at_the_budget_like_the_outcome():
  # Seed 0: s = 2 for both arms (0.4 updates to 0.9); seed 1: GRPO's points away from grad J.
  seeds = lambda a, b: [a, b]
  point = lambda j, projections: {
      "success": [j, j], "gradient_norm": [2.0, 2.0], "projection": projections,
      "signal": [[0.0, 0.0]] * 2, "trace": [[8.0, 8.0]] * 2}
  points = [point(0.1, seeds([1.0, 1.0], [-1.0, 1.0])), point(0.5, seeds([1.0, 1.0],
                                                                       [-1.0, 1.0]))]
  per_seed = forecast.per_seed_updates(0.9, points, 8)
  np.testing.assert_allclose(per_seed, [[0.4, 0.4], [np.inf, 0.4]])
  # x 300 (c = 1/300): GRPO's median is inf, so the budget is the range's top; seed 1's GRPO
  # counts at it, as a censored run does.
  outcome = forecast.predicted_outcome(per_seed * 300, 0, (100, 1000))
  assert outcome["budget"] == 1000
  np.testing.assert_allclose(outcome["updates"], [(120 + 1000) / 2, 120])
  np.testing.assert_allclose(outcome["reached"], [0.5, 1.0])
  assert forecast.predicted_outcome(per_seed[:1] * 300, 0, (100, 1000))["budget"] == 360


def test_the_outcome_is_the_restricted_mean_of_first_crossings():
  crossing = functools.partial(exact_metrics.tokens_to_reach, log_scale=False)
  assert crossing([0, 10, 20], [0.1, 0.5, 1.0], 0.9) == pytest.approx(18.0)
  assert crossing([0, 10], [0.95, 1.0], 0.9) == 0.0
  assert crossing([0, 10], [0.1, 0.8], 0.9) is None
  curves = {"0": {"updates": [0, 10, 20], "success": [0.1, 0.5, 1.0]},
            "1": {"updates": [0, 10, 20], "success": [0.1, 0.2, 0.3]}}  # censored at 20
  assert forecast.restricted_mean(curves, 0.9) == pytest.approx((18 + 20) / 2)


def test_point_names_and_budget():
  assert [forecast.point_name(p) for p in (1 / 16, 1 / 9, 0.1, 0.2, 0.3, 0.5)] == [
      "p1_16", "p1_9", "p0_1", "p0_2", "p0_3", "p0_5"]
  assert [forecast.budget_updates(u) for u in (10, 101, 5000, np.inf)] == [100, 310, 1000, 1000]
  assert forecast.budget_updates(3.4, 4, 8) == 8 and forecast.budget_updates(0.0, 4, 8) == 4


def _smoke_study(tmp_path):
  study = configs.get_config("forecast")
  task = {"length": 6, "n_decisive": 2, "n_keys": 3, "n_fillers": 2, "filler_blind": True}
  study.regimes = {f"uniform_sft_{rule}": {
      "task": {**task, "rule": rule},
      "warmup": {"steps": 150, "filler_probs": [0.5, 0.5], "key_accuracy": 0.0}}
      for rule in ("all", "count")}
  study.model.overrides = {"n_layers": 1, "d_model": 16, "n_heads": 2, "n_kv_heads": 2,
                           "d_ff": 32}
  study.arms = {name: configs.FORECAST_ARMS[name]
                for name in ("grpo", "oracle", "oracle_no_failed")}
  study.group_sizes = (2,)
  study.prompts_per_step = 2
  study.token_budget = {"2": 240}
  study.eval_points = 2
  study.seeds = [0, 1]
  study.forecast.fillers = ("uniform_sft",)
  study.forecast.start_success = (1 / 9, 0.3)
  study.forecast.calibration_accuracies = (0.0, 1.0)
  study.forecast.batches = 4
  study.forecast.held_out = 1
  study.forecast.training_seeds = (0, 1)
  study.forecast.budget_range = (4, 4)
  # The committed cell c is fitted on: this cell from the random policy, two arms' curves.
  cell = forecast.filler_cell(study, "uniform_sft", "all", 2)
  signature = sweep.signature(cell.__class__(**{**cell.__dict__, "warmup": None}), [0, 1])
  curve = lambda level: {"updates": [0, 50, 100], "success": [0.1, level, 0.95]}
  committed = {"signature": signature, "arms": {
      "grpo": {"curves": {"0": curve(0.3), "1": curve(0.4)}},
      "oracle": {"curves": {"0": curve(0.9), "1": curve(0.92)}}}}
  study.forecast.calibration = str(tmp_path / "committed.json")
  (tmp_path / "committed.json").write_text(json.dumps(committed))
  return study


def test_smoke_forecast_measures_calibrates_predicts_and_resumes(tmp_path):
  study = _smoke_study(tmp_path)
  workdir = tmp_path / "forecast"
  out = forecast.run(study, str(workdir))
  assert sorted(out["cells"]) == ["uniform_sft_all_p0_3_G2", "uniform_sft_all_p1_9_G2",
                                  "uniform_sft_count_p0_3_G2", "uniform_sft_count_p1_9_G2"]
  for cell in out["cells"].values():
    assert set(cell["updates"]) == {"grpo", "oracle", "oracle_no_failed"}
    assert cell["speedup"]["grpo"] in (1.0, None)
    assert 0 <= cell["zero_variance"] <= 1 and 0 < cell["start_success"] < 1
  stored = json.loads((workdir / "points" / "uniform_sft_all" / "G2.json").read_text())
  assert set(stored["points"]) == {"p1_9", "p0_3", "half_all", "half_count"}
  point = stored["points"]["p0_3"]
  assert np.asarray(point["projection"]).shape == (2, 3)  # seeds x arms
  assert np.all(np.asarray(point["trace"]) >= 0) and np.all(np.isfinite(point["noise_scale"]))
  # c: the geometric mean of predicted over measured updates of the committed arms.
  rows = out["calibration"]["arms"]
  fitted = [np.log(r["predicted"] / r["measured"]) for r in rows.values()
            if np.isfinite(r["predicted"])]  # an arm predicted never to arrive fits nothing
  assert fitted
  np.testing.assert_allclose(out["calibration"]["c"], np.exp(np.mean(fitted)), rtol=1e-6)
  assert rows["oracle"]["measured"] == pytest.approx((50 + 0.8 / 0.82 * 50) / 2)
  report = (workdir / "forecast.md").read_text()
  assert "## Criterion" in report and "uniform_sft_count_p0_3_G2" in report
  # A rerun measures nothing; other settings are refused, not mixed.
  before = (workdir / "points" / "uniform_sft_all" / "G2.json").stat().st_mtime_ns
  forecast.run(study, str(workdir))
  assert (workdir / "points" / "uniform_sft_all" / "G2.json").stat().st_mtime_ns == before
  # The held-out cell trains from the measured starting policies: its first J is theirs.
  study.forecast.stage = "train"
  (name,) = out["held_out"]
  assert set(forecast.run(study, str(workdir))) == {name}
  runs = json.loads((workdir / "runs" / f"{name}.json").read_text())["curves"]
  assert set(runs) == {"grpo", "oracle", "oracle_no_failed"} and set(runs["grpo"]) == {"0", "1"}
  spec = out["cells"][name]
  point = json.loads((workdir / "points" / f"{spec['filler']}_{spec['rule']}" / "G2.json")
                     .read_text())["points"][forecast.point_name(spec["p0"])]
  np.testing.assert_allclose([runs["oracle"][s]["success"][0] for s in ("0", "1")],
                             point["success"], rtol=1e-5)
  assert runs["grpo"]["0"]["updates"][-1] == 4
  assert forecast.run(study, str(workdir)) == {}  # trained cells are not trained again
  study.forecast.stage = "score"
  assert forecast.run(study, str(workdir))["complete"]
  study.forecast.stage = "forecast"
  study.forecast.batches = 3
  with pytest.raises(ValueError, match="other settings"):
    forecast.run(study, str(workdir))


def _curves(first_crossings, budget=100):
  """Curves at J 0 until `t` and 1 from it (never: None), over seeds."""
  return {str(s): {"updates": [0, t or budget, budget],
                   "success": [0.0, 1.0 if t else 0.0, 1.0 if t else 0.0]}
          for s, t in enumerate(first_crossings)}


def test_score_ranks_predicted_against_measured_speedups(tmp_path):
  # Measured oracle speed-ups 2, 4, 1 (restricted means: grpo 40/80/20, oracle 20/20/20);
  # predicted 1.5, 3, 1.2 ranks them exactly; the rival P_zero in reverse.
  speedups, zero_variance = [1.5, 3.0, 1.2], [0.3, 0.2, 0.1]
  cells_out = {f"c{i}": {"speedup": {"grpo": 1.0, "oracle": s}, "zero_variance": z,
                         "updates": {"grpo": 60.0, "oracle": 30.0}, "budget_updates": 100,
                         "filler": "uniform", "reached": {"grpo": 0.5, "oracle": 1.0}}
               for i, (s, z) in enumerate(zip(speedups, zero_variance))}
  (tmp_path / "forecast.json").write_text(json.dumps({
      "threshold": 0.9, "arms": {"grpo": "grpo", "oracle": "oracle"}, "cells": cells_out,
      "held_out": ["c0", "c1", "c2", "c3"], "commit": "abc1234", "criterion": "rho >= 0.7"}))
  (tmp_path / "runs").mkdir()
  for name, grpo in (("c0", 40), ("c1", 80), ("c2", 20)):
    (tmp_path / "runs" / f"{name}.json").write_text(json.dumps(
        {"curves": {"grpo": _curves([grpo, grpo]), "oracle": _curves([20, 20])}}))
  result = forecast.score(None, tmp_path)
  assert result["cells"] == ["c0", "c1", "c2"] and not result["complete"]
  assert result["rho"]["oracle"] == pytest.approx(1.0)
  assert result["rival_rho"] == pytest.approx(0.5)  # ranks 3, 2, 1 against 2, 3, 1
  assert not result["passed"]  # c3 not trained yet
  report = (tmp_path / "score.md").read_text()
  assert "3 of 4 held-out cells" in report
  assert "+1.00; the forecast not scored" in report
  assert "| uniform | 3 | 1.90 / 2.33 | 0.50 / 1.00 | 1.00 / 1.00 |" in report
  np.testing.assert_allclose(result["log_ratio"]["oracle"], np.log(30 / 18))  # 0.9 x 20
  (tmp_path / "runs" / "c3.json").write_text((tmp_path / "runs" / "c2.json").read_text())
  cells_out["c3"] = {**cells_out["c2"], "speedup": {"grpo": None, "oracle": float("inf")}}
  forecast_file = json.loads((tmp_path / "forecast.json").read_text())
  (tmp_path / "forecast.json").write_text(json.dumps({**forecast_file, "cells": cells_out}))
  result = forecast.score(None, tmp_path)  # c3: only the oracle arrives, ranked first
  assert result["complete"] and result["rho"]["oracle"] < 0.7 and not result["passed"]
  report = (tmp_path / "score.md").read_text()
  assert "the forecast failed" in report
  assert "| c3 | 100 | 18 | 0.50 / 1.00 | inf / 1.00 |" in report
  cells_out["c3"]["speedup"]["oracle"] = None  # neither arrives: left out of the ranking
  (tmp_path / "forecast.json").write_text(json.dumps({**forecast_file, "cells": cells_out}))
  result = forecast.score(None, tmp_path)
  assert result["rho"]["oracle"] == pytest.approx(1.0) and result["passed"]
  assert "the forecast passed" in (tmp_path / "score.md").read_text()


def test_speedup_names_who_arrives():
  assert forecast.speedup(60.0, 30.0) == 2.0 and forecast.speedup(np.inf, 30.0) == np.inf
  assert forecast.speedup(60.0, np.inf) == 0.0 and forecast.speedup(np.inf, np.inf) is None
  assert forecast.speedup(0.0, 0.0) == 1.0
