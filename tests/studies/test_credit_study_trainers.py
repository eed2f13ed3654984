"""Both trainers on the same cells: the presets match, and the report's comparisons."""

import json

import numpy as np
import pytest

from jaxcredit import tasks
from jaxcredit.lab import statistics
from jaxcredit.models import preset
from studies.credit_study import configs, configs_v1, report, sweep, trainers


@pytest.mark.parametrize("group_size", [8, 32])
def test_the_trainers_presets_run_the_same_cells(group_size):
  lab, v1 = configs.get_config("trainers"), configs_v1.get_config("trainers")
  train = v1.tasks[f"key_token_G{group_size:02d}"].train
  cell = sweep.cell_of(lab, "trainer_policy", group_size)
  key_token = tasks.get("key_token")
  assert cell.model == preset(train.model.preset, vocab_size=key_token.traceable.vocab_size,
                              **train.model.overrides)
  assert cell.task == key_token.options(**train.task.options)
  assert (cell.group_size, cell.prompts_per_step) == (train.rl.group_size,
                                                      train.rl.prompts_per_step)
  # The trainer's hook measures before an update: its 301st step measures the 300th.
  assert cell.eval_updates == tuple(range(0, train.rl.steps, train.rl.eval_every))
  assert cell.max_grad_norm == train.rl.max_grad_norm
  assert set(lab.fixed_learning_rates.values()) == {train.rl.learning_rate}
  assert list(lab.arms) == v1.tasks[f"key_token_G{group_size:02d}"].estimators
  assert train.export.every == 0 and not v1.tasks[f"key_token_G{group_size:02d}"].scored
  study_cell = sweep.cell_of(lab, "study_policy", group_size)
  assert study_cell.model == sweep.cell_of(configs.get_config("small"), "uniform_filler",
                                           group_size).model
  assert (study_cell.task, study_cell.eval_updates) == (cell.task, cell.eval_updates)


def _curve(final: float) -> dict:
  return {"updates": [0, 100, 300], "success": [0.0625, final / 2, final],
          "gen_tokens": [0, 1000, 3000]}


def test_the_report_compares_each_source_with_the_trainer(tmp_path):
  grpo_train, oracle_train = [0.1, 0.2, 0.3, 0.4], [0.95, 1.0, 1.0, 1.0]
  grpo_lab, oracle_lab = [0.7, 0.8, 0.9, 1.0, 0.95], [0.85, 0.9, 1.0, 1.0, 0.9]
  runs = {"8": {"grpo": {str(s): {**_curve(j), "seconds": 10.0} for s, j in
                         enumerate(grpo_train)},
                "oracle": {str(s): {**_curve(j), "seconds": 30.0} for s, j in
                           enumerate(oracle_train)}}}
  (tmp_path / "trainer_curves.json").write_text(json.dumps(
      {"runs": runs, "machine": "m", "commit": "c"}))
  (tmp_path / "cells" / "trainer_policy").mkdir(parents=True)
  (tmp_path / "cells" / "trainer_policy" / "G8.json").write_text(json.dumps({
      "seconds": 90.0, "arms": {
          "grpo": {"curves": {str(s): _curve(j) for s, j in enumerate(grpo_lab)}},
          "oracle": {"curves": {str(s): _curve(j) for s, j in enumerate(oracle_lab)}}}}))
  trainers.write_report(tmp_path)
  text = (tmp_path / "report.md").read_text()
  row = next(line for line in text.splitlines()
             if line.startswith("| 8 | grpo | 300 | lab, 2 layers d = 64 |"))
  d, low, high = statistics.welch_ci(grpo_lab, grpo_train)
  assert report.fmt_interval(d, low, high) in row
  assert f"{statistics.unpaired_p(grpo_lab, grpo_train):.3f}" in row
  assert row.endswith("| agree |") == (low <= 0 <= high)
  # The contrast, paired within a source (4 seeds: no interval), then across sources.
  contrast_row = next(line for line in text.splitlines()
                      if line.startswith("| 8 | 300 | lab, 2 layers d = 64 |"))
  lab_deltas = np.subtract(oracle_lab, grpo_lab)
  train_deltas = np.subtract(oracle_train, grpo_train)
  assert report.fmt_interval(*statistics.welch_ci(lab_deltas, train_deltas)) in contrast_row
  assert contrast_row.endswith("| differ |")  # +0.06 against +0.74
  assert "| 8 | grpo | 100 | jaxcredit.train | 4 | 0.125 (n/a) |" in text
  assert "- jaxcredit.train: 8 runs in 160 s, 20 s a run" in text
  assert "G run so far: jaxcredit.train 8; lab, 2 layers d = 64 8." in text
  assert "- lab, 2 layers d = 64: 10 runs in 90 s, 9 s a run" in text


def test_a_j_not_measured_at_an_update_is_refused():
  with pytest.raises(ValueError, match="No exact J measured after 200 updates"):
    trainers.at_update(_curve(1.0), 200)


def test_collecting_another_g_keeps_the_g_already_collected(tmp_path, monkeypatch):
  out, lab = tmp_path / "out", tmp_path / "lab"
  (lab / "cells" / "trainer_policy").mkdir(parents=True)
  (lab / "cells" / "trainer_policy" / "G32.json").write_text("{}")
  out.mkdir()
  eight = {"grpo": {"0": {**_curve(0.5), "seconds": 1.0}}}
  (out / "trainer_curves.json").write_text(json.dumps(
      {"runs": {"8": eight}, "machine": "m8", "commit": "c8"}))
  thirty_two = {"grpo": {"0": {**_curve(0.9), "seconds": 2.0}}}
  monkeypatch.setattr(trainers, "collect_trainer", lambda workdir: {"32": thirty_two})
  monkeypatch.setattr(sweep, "commit", lambda: "c32")
  monkeypatch.setattr(report, "machine", lambda: "m32")
  trainers.collect(tmp_path / "trainer", lab, out)
  stored = json.loads((out / "trainer_curves.json").read_text())
  assert stored["runs"] == {"8": eight, "32": thirty_two}
  assert (out / "cells" / "trainer_policy" / "G32.json").exists()
  assert trainers.collected_text(stored) == (
      "Both sources' runs collected for G = 8 at c8 on m8; for G = 32 at c32 on m32.")
  # One collection reads as before.
  assert trainers.collected_text({"runs": {"8": eight}, "machine": "m", "commit": "c"}) == (
      "Both sources' runs collected at c on m.")
