"""The credit sweep: tuned, paired, resumable cells and the verdicts of its comparisons."""

import contextlib
import dataclasses
import json
import pathlib

import numpy as np
import pytest

from jaxcredit.lab import batched
from jaxcredit.models import flops
from studies.credit_study import __main__ as credit_study_main
from studies.credit_study import configs, configs_v1, sweep
from studies.turn_study import configs as turn_study_configs
from studies.turn_study import runner as turn_study


@contextlib.contextmanager
def patched_train(monkeypatch):
  """No training allowed: every cell must be read back."""
  with monkeypatch.context() as patched:
    patched.setattr(batched.Runner, "train", lambda *a, **k: pytest.fail("retrained"))
    yield


@pytest.mark.usefixtures("every_cpu")  # the sweep's workers take a core each
def test_smoke_sweep_tunes_each_arm_trains_paired_seeds_reports_and_resumes(tmp_path,
                                                                            monkeypatch):
  study = configs.get_config("smoke")
  # Programs of two runs: every pass below reuses the first pass's compiled programs (a
  # process keeps the lab's recent programs), and runs are split over programs and joined back.
  study.runs_per_program = 2
  # First without the oracle; a rerun with it trains that arm only (pieces resume by arm).
  all_arms, study.arms = study.arms, {k: v for k, v in study.arms.items() if k != "oracle"}
  sweep.run(study, str(tmp_path))
  study.arms, trained = all_arms, []
  train = batched.Runner.train
  monkeypatch.setattr(batched.Runner, "train", lambda self, runs, width=None: (
      trained.extend(a for a, _, _ in runs), train(self, runs, width))[1])
  summaries = sweep.run(study, str(tmp_path))
  monkeypatch.undo()
  assert set(trained) == {list(study.arms).index("oracle")}
  tuned = json.loads((tmp_path / "cells" / "uniform_filler" / "tuning.json").read_text())
  for arm in study.arms:
    auc = tuned["arms"][arm]["tuning_auc"]
    assert sorted(auc) == sorted(str(r) for r in study.learning_rates)
    assert auc[str(tuned["arms"][arm]["learning_rate"])] == max(auc.values())
  assert len(tuned["spans"]) == 2
  assert [writer["preset"] for writer in tuned["writers"]] == [study.preset] * 2  # per write
  for g in study.group_sizes:
    cell = json.loads((tmp_path / "cells" / "uniform_filler" / f"G{g}.json").read_text())
    for arm in study.arms:
      assert cell["arms"][arm]["learning_rate"] == tuned["arms"][arm]["learning_rate"]
      assert sorted(cell["arms"][arm]["curves"]) == ["0", "1"]
      tokens = cell["arms"][arm]["curves"]["0"]["gen_tokens"]
      assert len(tokens) == study.eval_points + 1 and tokens[-1] == pytest.approx(
          study.token_budget[str(g)], rel=0.5)
    # The Monte-Carlo arm samples as much and is charged for its continuations too: 4 from
    # each of the T = 6 actions' states, 4 (6 + 5 + ... + 1) = 14 T tokens per response.
    curve = cell["arms"]["oracle_mc_4"]["curves"]["0"]
    np.testing.assert_array_equal(curve["charged_tokens"], np.multiply(curve["gen_tokens"], 15))
    assert "charged_tokens" not in cell["arms"]["grpo"]["curves"]["0"]
    # Paired by seed: every arm's run of a seed starts from the same policy.
    starts = {arm: cell["arms"][arm]["curves"]["1"]["success"][0] for arm in study.arms}
    assert len(set(starts.values())) == 1, starts
    assert set(summaries["uniform_filler"][g]) == set(study.arms)
  text = (tmp_path / "report.md").read_text()
  for g in study.group_sizes:
    assert f"### G = {g}" in text and f"| uniform_filler | {g} |" in text
  assert "n/a" in text and "slope of Δ_loc (auc) on log₂ G" in text
  assert text.count("At equal charged tokens") == len(study.group_sizes)
  assert "\n| oracle_mc_4 | " in text
  # and at equal charged FLOPs (its continuations beside the sampling and step).
  assert text.count("At equal charged FLOPs") == len(study.group_sizes)
  matched = [line for line in text.splitlines() if line.startswith("| oracle_mc_4 | ")
             and "e+" in line.split("|")[2]]
  assert len(matched) == len(study.group_sizes)
  assert "slope of Δ_loc (final) on GRPO's filler share at the start" in text
  assert (tmp_path / "localisation.png").exists()
  assert text.count("Budget: GRPO ") == len(study.group_sizes)
  oracle_row = [line for line in text.splitlines() if line.startswith("| oracle | 1.00 / ")]
  assert "| arm | cosine to exact | signal fraction | filler share |" in text and oracle_row
  # Exact credit: no filler gradient, no credit on filler; GRPO's on all T - K = 4 fillers
  # (a batch without credit counts 0).
  assert oracle_row[0].endswith("| 0.00 / 0.00 / 0.00 | 1.00 / 1.00 / 1.00 | "
                                "1.00 / 1.00 / 1.00 | 0.0 |")
  grpo_row = [line for line in text.splitlines() if line.startswith("| grpo | ") and " / " in line]
  assert 0 < float(grpo_row[0].split("|")[-2]) <= 4.0
  assert (tmp_path / "learning_curves_uniform_filler_G2.png").exists()
  assert (tmp_path / "learning_curves_uniform_filler_G2_charged.png").exists()
  # Each run's keys after its last update (9 prompts, 2 positions, 3 keys), read by outcome,
  # beside the stall counts.
  curve = cell["arms"]["grpo"]["curves"]["0"]
  assert np.asarray(curve["final_keys"]).shape == (9, 2, 3)
  assert np.asarray(curve["key_targets"]).shape == (9, 2)
  assert text.count("The policy's keys after the last update") == len(study.group_sizes)
  assert text.count("| uniform_filler | 4 | oracle_seq | ") == 1  # its stall row
  # A rerun reads every finished cell back instead of training it.
  with patched_train(monkeypatch):
    assert sweep.run(study, str(tmp_path)) == summaries
  # More seeds extend the cells run by run (a run does not depend on its company); fewer
  # read a subset of each cell back.
  cell_path = tmp_path / "cells" / "uniform_filler" / "G2.json"
  before, trained = json.loads(cell_path.read_text()), []
  monkeypatch.setattr(batched.Runner, "train", lambda self, runs, width=None: (
      trained.extend(runs), train(self, runs, width))[1])
  study.seeds = [0, 1, 2]
  sweep.run(study, str(tmp_path))
  monkeypatch.undo()
  assert [seed for _, _, seed in trained] == [2] * len(study.arms) * len(study.group_sizes)
  after = json.loads(cell_path.read_text())
  assert after["signature"]["seeds"] == [0, 1, 2]
  for arm in study.arms:
    assert sorted(after["arms"][arm]["curves"]) == ["0", "1", "2"]
    assert after["arms"][arm]["curves"]["1"] == before["arms"][arm]["curves"]["1"]
  study.seeds = [1]
  with patched_train(monkeypatch):
    fewer = sweep.run(study, str(tmp_path))
  assert all(set(by_seed) == {1} for by_seed in fewer["uniform_filler"][2].values())
  study.seeds = [0, 1]
  assert " min while pieces ran (the union of their spans" in text
  # A piece written under other settings is refused, not mixed with new runs.
  study.token_budget = {**study.token_budget, "2": 1920}
  with patched_train(monkeypatch), pytest.raises(
      ValueError, match=r"tuning.json was written under other settings \(cell.eval_every, "
                        r"cell.updates differ\); move it away"):
    sweep.run(study, str(tmp_path))
  study.token_budget = {**study.token_budget, "2": 960}
  tuning = tmp_path / "cells" / "uniform_filler" / "tuning.json"
  piece = json.loads(tuning.read_text())
  rate = piece["arms"]["grpo"]["learning_rate"]
  piece["arms"]["grpo"]["learning_rate"] = next(r for r in study.learning_rates if r != rate)
  tuning.write_text(json.dumps(piece))
  with patched_train(monkeypatch), pytest.raises(
      ValueError, match=r"G2.json holds grpo at other learning rates than the tuning's"):
    sweep.run(study, str(tmp_path))
  # In two worker processes, one core each: the same cells (up to the float rounding of
  # another thread count).
  # A piece that fails (a regime whose warm start is invalid) stops no other piece.
  study.workers, study.group_sizes = 2, (2,)
  study.regimes["broken"] = {**study.regimes["uniform_filler"].to_dict(),
                             "warmup": {"steps": 1, "filler_probs": [0.5, 0.4]}}
  with pytest.raises(RuntimeError, match=r"Pieces of the sweep failed .*: broken tuning: "
                                         r"ValueError\('warmup.filler_probs must be"):
    sweep.run(study, str(tmp_path / "workers"))
  study.run_regimes, study.workers = ("uniform_filler",), 1  # its cells are written
  with patched_train(monkeypatch):
    in_workers = sweep.run(study, str(tmp_path / "workers"))
  for g, summary in summaries["uniform_filler"].items():
    if g not in study.group_sizes:
      continue
    for arm, by_seed in summary.items():
      for seed, measured in by_seed.items():
        got = in_workers["uniform_filler"][g][arm][seed]
        np.testing.assert_allclose([got[m] for m in ("final", "auc")],
                                   [measured[m] for m in ("final", "auc")], atol=1e-4)


def test_more_workers_than_cores_are_refused(tmp_path, monkeypatch):
  study = configs.get_config("smoke")
  study.workers = 3
  monkeypatch.setattr(sweep.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
  with pytest.raises(ValueError, match=r"workers \(3\) must be at most the CPU cores "
                                       r"available \(2\)"):
    sweep.run(study, str(tmp_path))


@pytest.mark.parametrize("get_config,run,known", [
    (configs.get_config, sweep.run, "uniform_filler"),
    (turn_study_configs.get_config, turn_study.run, "eight_turns, four_turns")])
def test_an_unknown_regime_to_run_is_refused_before_any_training(tmp_path, get_config, run,
                                                                 known):
  study = get_config("smoke")
  study.run_regimes = ("uniform", *study.regimes)
  with pytest.raises(ValueError, match=f"Unknown regime 'uniform' in run_regimes; known: {known}"):
    run(study, str(tmp_path))
  assert not [path for path in tmp_path.iterdir() if path.is_dir()]


def test_the_study_entry_point_runs_the_sweep_for_a_config_with_regimes(monkeypatch):
  calls = []
  monkeypatch.setattr(sweep, "run", lambda study, workdir: calls.append(("sweep", workdir)))
  monkeypatch.setattr(credit_study_main.runner, "run",
                      lambda study, workdir: calls.append(("v1", workdir)))
  credit_study_main.run_any(configs.get_config("smoke"), "a")
  credit_study_main.run_any(configs_v1.get_config("smoke"), "b")
  assert calls == [("sweep", "a"), ("v1", "b")]


def test_the_full_preset_scales_the_budget_with_t_and_keeps_the_small_cells():
  full, small = configs.get_config("full"), configs.get_config("small")
  assert set(small.regimes) < set(full.regimes)  # a full run resumes the small one's cells
  short, long = (sweep.cell_of(full, regime, 8) for regime in ("uniform_filler",
                                                               "uniform_filler_T384"))
  # The full preset adds arms (and their settings).
  same_arms = lambda cell: dataclasses.replace(cell, arms=(), prm_learning_rates=None)
  assert same_arms(short) == same_arms(sweep.cell_of(small, "uniform_filler", 8))
  assert long.task.length == 384 and long.updates == short.updates  # 16x the tokens
  visible = sweep.cell_of(full, "visible_filler_T8", 8)  # E-TREE measures its J
  assert not visible.task.filler_blind and visible.updates == short.updates
  peaked = sweep.cell_of(full, "peaked_filler_T96", 8)
  assert peaked.warmup == sweep.cell_of(small, "peaked_filler", 8).warmup is not None
  longer = sweep.cell_of(full, "peaked_filler_Z2", 8)
  assert longer.updates == 2 * sweep.cell_of(small, "peaked_filler", 8).updates
  tuning_tokens = lambda study, regime: sweep.tuning_cell(study, regime).updates * 8 * 8 * 24
  assert tuning_tokens(full, "peaked_filler_Z2") == pytest.approx(  # up to the rounding of
      2 * tuning_tokens(small, "peaked_filler"), rel=0.03)          # updates per block
  language = sweep.cell_of(full, "zipf_explain_T128", 8)
  assert language.task.length == 128 and language.updates == short.updates
  assert language.warmup.filler_probs is None and not language.mechanism_batches
  wide, batch = (sweep.cell_of(full, f"peaked_filler_{axis}", 8) for axis in ("d64", "B16"))
  base = sweep.cell_of(small, "peaked_filler", 8)
  assert (wide.model.d_model, wide.model.n_layers, wide.prompts_per_step) == (64, 1, 8)
  assert wide.warmup == base.warmup and wide.updates == base.updates
  assert batch.model == base.model and batch.prompts_per_step == 16
  assert batch.updates == pytest.approx(base.updates / 2, rel=0.05)  # the same tokens
  middling = sweep.cell_of(full, "mid_filler", 8).warmup.filler_probs
  assert sweep.cell_of(full, "mid_filler_Z3", 8).updates == 3 * sweep.cell_of(
      full, "mid_filler", 8).updates
  assert -np.sum(np.multiply(middling, np.log(middling))) == pytest.approx(0.29, abs=0.005)
  # The regimes, budgets, language, scale, mid_filler and mid_filler_Z3 presets' cells are
  # the full preset's (a full run resumes them).
  for preset in ("regimes", "budgets", "language", "scale", "mid_filler", "mid_filler_Z3"):
    some = configs.get_config(preset)
    assert set(some.regimes) < set(full.regimes)
    for regime in some.regimes:
      assert (sweep.signature(sweep.cell_of(some, regime, 8), some.seeds)
              == sweep.signature(sweep.cell_of(full, regime, 8), full.seeds))


def test_the_stalls_preset_runs_grpo_and_the_exact_credit_at_40_seeds_recording_their_keys():
  study, small = (configs.get_config(p) for p in ("stalls", "small"))
  cell = sweep.cell_of(study, "peaked_filler", 8)
  assert list(study.regimes) == ["peaked_filler"] and list(study.arms) == ["grpo", "oracle"]
  assert study.seeds == list(range(40)) and not cell.mechanism_batches
  assert cell.task == sweep.cell_of(small, "peaked_filler", 8).task and cell.task.filler_blind
  assert cell.eval_updates[:3] == (0, 1, 2) and cell.eval_updates[-1] == cell.updates


def test_the_warm_start_preset_reads_the_start_at_0_3_at_log_spaced_updates_at_the_tuned_rates():
  study, regimes = (configs.get_config(p) for p in ("warm_start", "regimes"))
  assert list(study.regimes) == ["start_at_0_3"] and study.group_sizes == (4, 8, 16, 32)
  tuned = json.loads((pathlib.Path(configs.__file__).parent / "results" / "regimes" / "cells"
                      / "start_at_0_3" / "tuning.json").read_text())["arms"]
  assert study.fixed_learning_rates.to_dict() == {"grpo": tuned["grpo"]["learning_rate"],
                                                  "oracle": tuned["oracle"]["learning_rate"],
                                                  "oracle_at_3e-3": tuned["grpo"]["learning_rate"]}
  assert study.arms["oracle_at_3e-3"] == study.arms["oracle"] == regimes.arms["oracle"]
  for g in study.group_sizes:
    cell, linear = (sweep.cell_of(s, "start_at_0_3", g) for s in (study, regimes))
    assert (cell.task, cell.model, cell.warmup) == (linear.task, linear.model, linear.warmup)
    assert cell.eval_updates[:3] == (0, 1, 2) and cell.eval_updates[-1] == cell.updates
    assert linear.eval_updates[1] >= 20 and not cell.mechanism_batches


def test_the_stalls_mid_preset_runs_both_arms_at_their_same_rate_best_on_middling_filler():
  study, mid = (configs.get_config(p) for p in ("stalls_mid", "mid_filler"))
  assert list(study.arms) == ["grpo", "oracle"] and study.seeds == list(range(40))
  assert study.fixed_learning_rates.to_dict() == {"grpo": 1e-3, "oracle": 1e-3}
  same_rate = json.loads((pathlib.Path(configs.__file__).parent / "results" / "same_rate"
                          / "cells" / "mid_filler_Z3" / "G8.json").read_text())["arms"]
  final = lambda arm: np.mean([c["success"][-1] for c in same_rate[arm]["curves"].values()])
  assert final("grpo_at_1e-3") > final("grpo") and final("oracle_at_1e-3") > final("oracle")
  assert same_rate["grpo_at_1e-3"]["learning_rate"] == 1e-3 == same_rate["oracle_at_1e-3"][
      "learning_rate"]
  cell, tuned_cell = (sweep.cell_of(s, "mid_filler", 8) for s in (study, mid))
  assert (cell.task, cell.model, cell.warmup, cell.updates) == (
      tuned_cell.task, tuned_cell.model, tuned_cell.warmup, tuned_cell.updates)
  assert cell.eval_updates[:3] == (0, 1, 2) and not cell.mechanism_batches


def test_the_ktae_shared_preset_draws_filler_from_the_key_alphabet():
  study, small = (configs.get_config(p) for p in ("ktae_shared", "small"))
  cell = sweep.cell_of(study, "uniform_filler_shared", 8)
  assert set(study.arms) == {"grpo", "oracle", "ktae"} and study.group_sizes == (8,)
  assert cell.task.shared_alphabet and list(cell.task.fillers) == list(cell.task.keys)
  assert cell.task == dataclasses.replace(sweep.cell_of(small, "uniform_filler", 8).task,
                                          shared_alphabet=True)


def test_the_entropy_sums_preset_runs_the_80_20_arms_on_the_full_presets_target_sum():
  study, full = (configs.get_config(p) for p in ("entropy_sums", "full"))
  assert set(study.arms) == {"grpo", "entropy80", "entropy80_low"}
  assert study.arms["entropy80"] == full.arms["entropy80"] and study.group_sizes == (8,)
  cell, full_cell = (sweep.cell_of(s, "target_sum", 8) for s in (study, full))
  assert (cell.task, cell.model, cell.eval_updates) == (full_cell.task, full_cell.model,
                                                        full_cell.eval_updates)


def test_the_rate_grid_preset_runs_every_core_arm_at_every_rate_on_the_primary_cells():
  study, small = (configs.get_config(p) for p in ("rate_grid", "small"))
  rates = {name: study.fixed_learning_rates[name] for name in study.arms}
  grid = {(configs.ARMS[name], rate) for name, rate in rates.items()}
  assert grid == {(configs.ARMS[arm], rate) for arm in ("grpo", "oracle", "oracle_seq")
                  for rate in small.learning_rates}
  assert len(rates) == 12 and rates["grpo"] == 1e-3 and study.group_sizes == (8,)
  for regime in small.regimes:
    cell, primary = (sweep.cell_of(s, regime, 8) for s in (study, small))
    assert (cell.task, cell.model, cell.warmup, cell.eval_updates) == (
        primary.task, primary.model, primary.warmup, primary.eval_updates)


@pytest.mark.parametrize("preset, added", [
    ("primary", set()),
    ("entropy", {"entropy80", "entropy80_low"}),
    ("ktae_prime", {"ktae", "prime_prm_1e-3", "prime_prm_1e-4", "prime_prm_1e-5",
                    "prime_prm_1e-6"}),
    ("mc_ladder", {"oracle_mc_1", "oracle_mc_4", "oracle_mc_16", "oracle_mc_64"}),
    ("critic", {"ppo_gae"})])
def test_the_g8_presets_read_the_small_presets_pieces_back(preset, added):
  """Their tuning and G = 8 pieces have the small preset's signatures (a run in a copy of
  the small workdir trains only the added arms, or seeds), and they add every one of them."""
  study, small = (configs.get_config(p) for p in (preset, "small"))
  assert set(study.arms) == set(small.arms) | added
  for regime in small.regimes:
    assert (sweep.signature(sweep.tuning_cell(study, regime), study.tuning_seeds,
                            list(study.learning_rates))
            == sweep.signature(sweep.tuning_cell(small, regime), small.tuning_seeds,
                               list(small.learning_rates)))
    # A cell's seeds may differ: it grows run by run.
    assert (sweep.signature(sweep.cell_of(study, regime, 8), ())
            == sweep.signature(sweep.cell_of(small, regime, 8), ()))


def test_an_arms_prm_rate_reaches_its_runs_is_recorded_and_a_changed_one_is_refused(tmp_path):
  """A PRIME arm's PRM rate is a setting of the arm (not of the cell's signature): it is
  the Cell's entry for the arm's runs, written with the arm, and a file holding the arm
  under another rate is refused rather than read back."""
  study = configs.get_config("ktae_prime")
  cell = sweep.cell_of(study, "uniform_filler", 8)
  assert dict(zip(study.arms, cell.prm_learning_rates)) == {
      **{arm: None for arm in study.arms}, "prime_prm_1e-3": 1e-3, "prime_prm_1e-4": 1e-4,
      "prime_prm_1e-5": 1e-5, "prime_prm_1e-6": 1e-6}
  expected = sweep.signature(cell, study.seeds)
  path = tmp_path / "G8.json"
  record = {"learning_rate": 1e-3, "curves": {}}
  path.write_text(json.dumps({"signature": expected, "arms": {
      "grpo": record, "prime_prm_1e-4": {**record, "prm_learning_rate": 1e-4}}}))
  _, missing = sweep._piece_arms(study, path, expected)
  assert "prime_prm_1e-4" not in missing and "prime_prm_1e-5" in missing
  path.write_text(json.dumps({"signature": expected, "arms": {
      "prime_prm_1e-4": {**record, "prm_learning_rate": 1e-5}}}))
  with pytest.raises(ValueError, match=r"G8.json holds prime_prm_1e-4 under other settings "
                                       r"than the study's \(prm_learning_rate\)"):
    sweep._piece_arms(study, path, expected)


def test_runs_split_over_programs_join_back_in_order():
  class Runner:  # each run's rows carry its seed; pads to the width like batched.Runner
    widths = []

    def train(self, runs, width):
      self.widths.append(width)
      seeds = np.asarray([s for _, _, s in runs], float)
      return {"success": np.stack([seeds, seeds + 1], 1), "pass@k": {4: seeds[:, None]},
              "final_keys": np.broadcast_to(seeds[:, None, None, None], (len(seeds), 3, 2, 4)),
              "gen_tokens": np.arange(2), "compile_seconds": 1.0, "run_seconds": 2.0}

  study = configs.get_config("smoke")
  runs = [(0, 1e-3, seed) for seed in range(5)]
  study.runs_per_program = 2
  joined = sweep.train_in_programs(study, Runner(), runs)
  assert Runner.widths == [2, 2, 2]
  np.testing.assert_array_equal(joined["success"][:, 0], np.arange(5))
  np.testing.assert_array_equal(joined["pass@k"][4][:, 0], np.arange(5))
  np.testing.assert_array_equal(joined["final_keys"][:, 0, 0, 0], np.arange(5))
  np.testing.assert_array_equal(joined["gen_tokens"], [0, 1])
  assert (joined["compile_seconds"], joined["run_seconds"]) == (3.0, 6.0)


def test_a_target_sum_regime_runs_through_the_sweep(tmp_path):
  """A regime naming task_name="target_sum": tuned, trained and reported like key_token's,
  starting at the exact J of each seed's policy, each run's curve on its own generated
  tokens (responses stop at EOS), no gradient measurements; an unknown task_name is
  named."""
  from flax import nnx

  from jaxcredit.models import Transformer
  from jaxcredit.tasks import target_sum

  study = configs.get_config("smoke")
  study.regimes = {"sums": {"task_name": "target_sum", "task": {
      "n_digits": 3, "n_values": 3, "target_low": 1, "target_high": 5}}}
  study.group_sizes, study.token_budget = (2,), {"2": 480}
  summaries = sweep.run(study, str(tmp_path))
  cell = json.loads((tmp_path / "cells" / "sums" / "G2.json").read_text())
  curves = [curve for arm in study.arms for curve in cell["arms"][arm]["curves"].values()]
  last = [curve["gen_tokens"][-1] for curve in curves]
  assert all(0 < t <= 480 for t in last) and len(set(last)) > 1
  assert all("cosine_to_exact" not in curve and "noisy_tokens" not in curve for curve in curves)
  assert set(summaries["sums"][2]) == set(study.arms)
  # Before any update: the exact J of the seed's fresh policy over every target.
  cell_config = sweep.cell_of(study, "sums", 2)
  prompts = np.asarray([[target_sum.BOS, target_sum.DIGIT0 + 3, target_sum.DIGIT0,
                         target_sum.DIGIT0 + s, target_sum.SEP] for s in range(1, 6)])
  start = target_sum.oracle.exact_success(Transformer(cell_config.model, rngs=nnx.Rngs(1)),
                                          cell_config.task, prompts, np.arange(1, 6))
  for arm in study.arms:
    assert cell["arms"][arm]["curves"]["1"]["success"][0] == pytest.approx(start.mean(), abs=1e-6)
  text = (tmp_path / "report.md").read_text()
  assert "## Regime `sums`: target_sum {'n_digits': 3" in text and "| sums | 2 |" in text
  study.regimes["sums"]["task_name"] = "target_sums"
  with pytest.raises(ValueError, match="Regime 'sums': unknown task_name 'target_sums'; "
                                       "known: key_token, target_sum, zipf_explain"):
    sweep.cell_of(study, "sums", 2)


def test_a_zipf_explain_regime_warms_up_and_runs_through_the_sweep(tmp_path):
  """A regime naming task_name="zipf_explain" with a warmup (the grammar's SFT), and a
  policy and prompts per update of its own: tuned, trained and reported; every arm of a
  seed starts from the same warmed-up policy and the same estimate of its J (the oracle's
  draws are the seed's); no gradient measurements."""
  study = configs.get_config("smoke")
  study.regimes = {"explain": {"task_name": "zipf_explain", "task": {
      "length": 8, "n_answers": 2, "n_keys": 2, "n_words": 4, "branching": 3},
      "warmup": {"steps": 30, "key_accuracy": 0.5, "learning_rate": 1e-2},
      "model_overrides": {"d_ff": 32}, "prompts_per_step": 2}}  # the regime's own policy
  study.group_sizes, study.token_budget = (2,), {"2": 480}
  summaries = sweep.run(study, str(tmp_path))
  cell = json.loads((tmp_path / "cells" / "explain" / "G2.json").read_text())
  for seed in ("0", "1"):
    starts = {cell["arms"][arm]["curves"][seed]["success"][0] for arm in study.arms}
    assert len(starts) == 1 and 0.0 < starts.pop() < 1.0
  curves = [curve for arm in study.arms for curve in cell["arms"][arm]["curves"].values()]
  assert all("cosine_to_exact" not in curve and "noisy_tokens" not in curve for curve in curves)
  assert set(summaries["explain"][2]) == set(study.arms)
  heading = next(line for line in (tmp_path / "report.md").read_text().splitlines()
                 if line.startswith("## Regime `explain`: zipf_explain {"))
  assert "'length': 8" in heading and "warm start {" in heading
  assert heading.endswith(", policy {'d_ff': 32}, 2 prompts per update")
  assert sweep.cell_of(study, "explain", 2).model.d_ff == 32
  study.regimes["explain"]["warmup"]["filler_probs"] = [0.5, 0.5]
  with pytest.raises(ValueError, match="a warmup without filler_probs"):
    sweep.cell_of(study, "explain", 2)


def test_arms_with_a_fixed_learning_rate_take_it_untuned(tmp_path, monkeypatch):
  study = configs.get_config("smoke")
  study.fixed_learning_rates = {arm: 3e-3 for arm in study.arms}
  with patched_train(monkeypatch):
    tuned = sweep.tune(study, "uniform_filler", {}, tmp_path / "tuning.json")
  assert {arm: t["learning_rate"] for arm, t in tuned["arms"].items()} == {
      arm: 3e-3 for arm in study.arms}
  assert all(t["tuning_auc"] == {} for t in tuned["arms"].values())
  # The same-rate preset: the tuned arms are read back from the mid_filler_Z3 pieces, the
  # controls take the other arms' tuned rates.
  same, z3 = configs.get_config("same_rate"), configs.get_config("mid_filler_Z3")
  assert set(same.arms) - set(z3.arms) == set(same.fixed_learning_rates) == {
      "grpo_at_1e-3", "oracle_at_1e-3", "oracle_seq_at_3e-3"}
  for cell_of in (lambda s: sweep.tuning_cell(s, "mid_filler_Z3"),
                  lambda s: sweep.cell_of(s, "mid_filler_Z3", 8)):
    assert sweep.signature(cell_of(same), ()) == sweep.signature(cell_of(z3), ())
  assert not set(same.fixed_learning_rates) & set(configs.get_config("full").arms)


def test_a_tuning_by_auc_and_final_j_records_both_and_chooses_by_their_sum(tmp_path):
  study = configs.get_config("smoke")
  study.arms = {arm: study.arms[arm] for arm in ("grpo", "oracle")}
  study.tuning_criterion = "auc+final"
  tuned = sweep.tune(study, "uniform_filler", {}, tmp_path / "tuning.json")
  assert tuned["signature"]["tuning_criterion"] == "auc+final"
  for t in tuned["arms"].values():
    auc, final = t["tuning_auc"], t["tuning_final"]
    assert sorted(auc) == sorted(final) == sorted(str(r) for r in study.learning_rates)
    assert all(0.0 <= f <= 1.0 for f in final.values())
    score = {r: auc[r] + final[r] for r in auc}
    assert score[str(t["learning_rate"])] == max(score.values())
  # A piece tuned by AUC alone is not resumed under another criterion.
  study.tuning_criterion = "auc"
  with pytest.raises(ValueError, match="tuning_criterion"):
    sweep.tune(study, "uniform_filler", {}, tmp_path / "tuning.json")
  study.tuning_criterion = "final"
  with pytest.raises(ValueError, match="unknown tuning_criterion 'final'; known: auc, auc"):
    sweep.tune(study, "uniform_filler", {}, tmp_path / "other.json")
  # The report names the criterion and the rate AUC or final J alone would choose.
  piece = {"signature": {"tuning_criterion": "auc+final"}, "arms": {
      "grpo": {"learning_rate": 0.001, "tuning_auc": {"0.001": 0.5, "0.01": 0.6},
               "tuning_final": {"0.001": 0.9, "0.01": 0.7}},
      "oracle": {"learning_rate": 0.003, "tuning_auc": {}}}}
  study.arms = {"grpo": "grpo", "oracle": "oracle"}
  assert sweep.tuning_line(study, piece) == (
      "Learning rates chosen by auc+final (the tuning seeds' mean AUC / final J at each rate): "
      "grpo 0.001 (0.001: 0.500 / 0.900, 0.01: 0.600 / 0.700; AUC alone 0.01); "
      "oracle 0.003 (fixed, not tuned)")


@pytest.mark.parametrize("preset, g", [("tuning_full", 8), ("tuning_g32", 32)])
def test_the_tuning_presets_tune_the_core_arms_on_5_seeds_at_the_full_budget(preset, g):
  study = configs.get_config(preset)
  assert list(study.arms) == ["grpo", "oracle", "oracle_seq"] and study.group_sizes == (g,)
  assert len(study.tuning_seeds) == 5 and not set(study.tuning_seeds) & set(study.seeds)
  assert study.tuning_criterion == "auc+final"
  for regime in study.regimes:
    cell, primary = (sweep.cell_of(s, regime, g) for s in (study, configs.get_config("small")))
    assert sweep.tuning_cell(study, regime) == cell
    assert (cell.task, cell.model, cell.warmup, cell.eval_updates, cell.updates) == (
        primary.task, primary.model, primary.warmup, primary.eval_updates, primary.updates)


def test_a_setting_a_stored_signature_lacks_reads_as_none(tmp_path):
  """A Cell field added after a piece was written, at a None default, changes no run; any
  other difference is refused, naming the setting."""
  expected = {"cell": {"updates": 10, "tree": None}, "seeds": [0]}
  path = tmp_path / "G8.json"
  sweep.refuse_other_settings(path, {"cell": {"updates": 10}, "seeds": [0]}, expected)
  with pytest.raises(ValueError, match=r"\(cell.tree differ\)"):
    sweep.refuse_other_settings(path, {"cell": {"updates": 10}, "seeds": [0]},
                                {**expected, "cell": {"updates": 10, "tree": "a tree"}})
  with pytest.raises(ValueError, match=r"signature \(none stored\) differ"):
    sweep.refuse_other_settings(path, None, expected)


def test_log_spaced_evaluations_resolve_the_start_and_keep_the_measurements_in_range():
  assert sweep.log_spaced(1000, 4) == (0, 1, 10, 100)
  assert sweep.log_spaced(6, 20) == (0, 1, 2, 3, 4, 5)  # repeats dropped
  study = configs.get_config("small")
  study.eval_spacing = "log"
  cell = sweep.cell_of(study, "uniform_filler", 8)
  assert cell.eval_at[:4] == (0, 1, 2, 3) and cell.eval_updates[-1] == cell.updates
  assert len(cell.eval_at) < study.eval_points  # the smallest steps round to the same update
  assert cell.measured_evals == (0, 3, cell.n_evals - 1)  # start, early, end
  linear = sweep.cell_of(configs.get_config("small"), "uniform_filler", 8)
  assert linear.eval_at is None and linear.updates == cell.updates


def test_runs_without_recorded_flops_are_charged_what_their_arm_costs_per_update():
  study = configs.get_config("smoke")
  study.arms = {**study.arms, "ppo_gae": configs.ARMS["ppo_gae"],
                "cut": {"name": "vineppo", "k": 4, "positions": "cutpoints:0.9"}}
  cell = sweep.cell_of(study, "uniform_filler", 2)
  curve = {"updates": [0, 5, 10], "success": [0.1, 0.2, 0.3]}
  recorded = {**curve, "charged_flops": [0.0, 1.0, 2.0]}
  curves = {"grpo": {0: curve, 1: recorded}, "ppo_gae": {0: curve}, "cut": {0: curve}}
  charged = sweep.charge_flops(cell, list(study.arms), curves)
  # Sampling and the step: 4 passes over 2 x 3 prompts' responses; the critic's values and
  # step: 4 more, without logits.
  rows, length = cell.prompts_per_step * cell.group_size, cell.task.length
  policy = 4 * rows * flops.sampling_flops(cell.model, cell.task.prompt_length, length)
  trunk = 4 * rows * flops.sequence_flops(cell.model, cell.task.prompt_length + length,
                                          logits=False)
  np.testing.assert_allclose(charged["grpo"][0]["charged_flops"], [0, 5 * policy, 10 * policy],
                             rtol=1e-5)
  np.testing.assert_allclose(charged["ppo_gae"][0]["charged_flops"],
                             np.multiply([0, 5, 10], policy + trunk), rtol=1e-5)
  assert charged["grpo"][1] == recorded  # what a run recorded stays
  assert "charged_flops" not in charged["cut"][0]  # cutpoints: the charge depends on samples
