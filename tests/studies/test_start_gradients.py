"""studies.start_gradients: GRPO's gradient at the start, across T, G and filler."""

import dataclasses
import json

import ml_collections
import numpy as np
import pytest

from jaxcredit.lab import batched
from studies.credit_study import configs as credit_study_configs
from studies.credit_study import sweep
from studies.start_gradients import configs
from studies.start_gradients import runner as start_gradients


def _study():
  study = configs.get_config("smoke")
  study.group_sizes = (2,)
  study.mechanism_batches = 1
  study.arms = {name: study.arms[name] for name in ("grpo", "oracle")}  # for the sweep's cell
  return study


def test_the_start_measurements_are_the_sweeps_at_evaluation_0_and_resume(tmp_path, monkeypatch):
  """The same numbers as a sweep cell's runs (every arm, many updates) measure before their
  first update; written once per (regime, G) and read back on a rerun."""
  study = _study()
  results = start_gradients.run(study, str(tmp_path))
  assert set(results) == {"uniform_filler", "uniform_filler_T12"}
  cell = sweep.cell_of(study, "uniform_filler", 2)
  assert len(cell.arms) > 1 and cell.updates > 1  # GRPO among other arms, trained on
  trained = batched.Runner(cell).train([(0, 1e-2, seed) for seed in study.seeds])
  for name in start_gradients.MEASURED:
    np.testing.assert_allclose(results["uniform_filler"][2][name], trained[name][:, 0],
                               rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(results["uniform_filler"][2]["filler_entropy"],
                             trained["filler_entropy"][:, 0], rtol=1e-5)
  for cells in results.values():  # (a batch whose groups all tie gives no gradient: 0)
    assert np.any(np.asarray(cells[2]["filler_norm"]) > 0)
    assert np.all(np.isfinite(cells[2]["cosine_to_exact"]))
  text = (tmp_path / "report.md").read_text()
  assert "| uniform_filler_T12 | 12 | " in text and "| uniform_filler | 2 | " in text
  assert json.loads((tmp_path / "cells/uniform_filler/G2.json").read_text())["signature"]
  monkeypatch.setattr(batched.Runner, "train", lambda *a, **k: pytest.fail("remeasured"))
  again = start_gradients.run(study, str(tmp_path))
  assert again["uniform_filler_T12"][2]["filler_norm"] == results["uniform_filler_T12"][2][
      "filler_norm"]
  study.seeds = [0]  # a cell written under other settings is refused, not overwritten
  with pytest.raises(ValueError, match="written under other settings .*seeds"):
    start_gradients.run(study, str(tmp_path))
  study.seeds = [0, 1]
  study.group_sizes, study.report_only = (2, 4), True  # G = 4 is not measured: named
  assert set(start_gradients.run(study, str(tmp_path))["uniform_filler"]) == {2}
  assert ("Not measured: uniform_filler G = 4, uniform_filler_T12 G = 4."
          in (tmp_path / "report.md").read_text())


def test_the_slope_on_filler_tokens_recovers_a_square_root_law():
  """Ratios drawn as c sqrt(T - K) times log-normal noise: the fitted slope is 1/2 within
  its interval, per family and G; a family with one length has no slope."""
  rng = np.random.default_rng(0)
  study = ml_collections.ConfigDict({"regimes": {
      name: {"task": {"length": length, "n_decisive": 2}}
      for name, length in (("peaked", 24), ("peaked_T96", 96), ("peaked_T384", 384),
                           ("mid", 24))}})
  results = {}
  for regime, spec in study.regimes.items():
    fillers = spec.task.length - 2
    for g in (4, 8):
      decisive = rng.uniform(0.5, 2.0, 40)
      results.setdefault(regime, {})[g] = {
          "decisive_norm": decisive,
          "filler_norm": decisive * 0.3 * np.sqrt(fillers) * np.exp(rng.normal(0, 0.1, 40))}
  fitted = start_gradients.slopes(study, results, rng)
  assert set(fitted) == {("peaked", 4), ("peaked", 8)}
  for slope, low, high in fitted.values():
    assert low < 0.5 < high and high - low < 0.05


def test_start_cells_refuse_what_has_no_decisive_and_filler_split():
  full = credit_study_configs.get_config("full")
  with pytest.raises(ValueError, match="'target_sum' is not key_token"):
    start_gradients.start_cell(full, "target_sum", 8)
  full.mechanism_batches = 0
  with pytest.raises(ValueError, match="mechanism_batches"):
    start_gradients.start_cell(full, "peaked_filler_T96", 8)


def test_the_t_axis_preset_measures_the_full_presets_starting_policies():
  """Its cells are the full preset's, measured at evaluation 0 with GRPO alone."""
  t_axis, full = configs.get_config("t_axis"), credit_study_configs.get_config("full")
  assert {start_gradients.family(r) for r in t_axis.run_regimes} == {
      "uniform_filler", "peaked_filler", "mid_filler"}
  for regime in t_axis.run_regimes:
    cell = start_gradients.start_cell(t_axis, regime, 32)
    same = dataclasses.replace(sweep.cell_of(full, regime, 32), arms=cell.arms, updates=1,
                               eval_every=1, mechanism_evals=(0,), prm_learning_rates=None)
    assert cell == same and cell.measured_evals == (0,)
