"""The study's evidence by hypothesis, read back from sweep cells written to disk."""

import json
import re

import numpy as np
import pytest

from jaxcredit.lab import statistics
from studies.credit_study import verdicts

TOKENS = [0.0, *np.arange(1, 11) * 1000.0]  # 11 measurements


def _curve(plateau: float, reached_at: int, **mechanism) -> dict:
  """J at 0.1 until measurement `reached_at` (at most 7: the last 3, final J, are the
  plateau), where it is exactly 0.9, then `plateau`."""
  success = [0.1] * reached_at + [0.9] + [plateau] * (10 - reached_at)
  return {"updates": list(range(11)), "success": success, "gen_tokens": TOKENS,
          "pass@k": {"16": success}, "zero_variance_groups": 0.5, **mechanism}


def _write(workdir, regime: str, g: int, arms: dict) -> None:
  path = workdir / "cells" / regime / f"G{g}.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({"arms": {arm: {"curves": {str(s): c for s, c in runs.items()},
                                             "learning_rate": 1e-3}
                                       for arm, runs in arms.items()}}))


def test_a_cells_evidence_pairs_by_seed_and_reads_kaplan_meier_times_to_the_level():
  rng = np.random.default_rng(0)
  seeds = range(8)  # the smallest sign-flip p, 2 / 2^8, survives Holm over two arms
  grpo_final = np.concatenate([rng.uniform(0.9, 1.0, 6), [0.1, 0.1]])
  seq_final = rng.uniform(0.9, 1.0, 8)
  stuck = lambda **kw: {**_curve(0.1, 3, **kw), "success": [0.1] * 11,
                        "pass@k": {"16": [0.1] * 11}}
  mechanism = lambda s: {"cosine_to_exact": [0.2 + s, 0.0], "filler_norm": [3.0, 1.0],
                         "decisive_norm": [1.0, 1.0]}
  curves = {
      # GRPO reaches 0.9 (0.9 x the oracle's plateau of 1) at measurement 5 or 7 (5,000 or
      # 7,000 tokens) in 6 seeds and never in 2; the oracle at measurement 2 in every seed.
      # Kaplan-Meier: S = 5/8 after 5k, 5/8 x 2/5 = 1/4 after 7k, so GRPO's median is 7k
      # (the median of the 6 that reach it, 6k, leaves the 2 stalled runs out).
      "grpo": {s: (_curve(grpo_final[s], 5 + 2 * (s % 2), **mechanism(s)) if s < 6
                   else stuck(**mechanism(s))) for s in seeds},
      "oracle": {s: _curve(1.0, 2) for s in seeds},
      "oracle_seq": {s: _curve(seq_final[s], 7) for s in seeds}}
  e = verdicts.cell_evidence(curves, rng)
  grpo, oracle = e["time_to_level"]["grpo"], e["time_to_level"]["oracle"]
  assert (grpo["tokens"]["median"], grpo["updates"]["median"]) == pytest.approx((7000.0, 7.0))
  assert grpo["tokens"]["reached"] == 0.75
  assert (oracle["tokens"]["median"], oracle["updates"]["median"]) == pytest.approx((2000.0, 2.0))
  assert verdicts._speed(e["time_to_level"], "tokens") == "7k (75% reach) → 2k (3.5×)"
  assert e["final"]["oracle"]["delta"][0] == pytest.approx(np.mean(1.0 - grpo_final))
  np.testing.assert_allclose(e["loc"], 1.0 - seq_final)
  assert e["cosine"] == pytest.approx(3.7) and e["filler_share"] == pytest.approx(0.75)
  d = 1.0 - grpo_final
  assert e["final"]["oracle"]["p"] == statistics.sign_flip_p(d)
  assert e["final"]["oracle"]["p_tost"] == statistics.tost(d, verdicts.MARGIN)
  assert "verdict" not in e["final"]["oracle"]  # decided across cells, by `correct`


def _evidence(oracle_reach: int, arms=("grpo", "oracle")) -> dict:
  """Cells of two regimes at G = 4 and 8 (8 seeds); GRPO reaches 0.9 at measurement 6,
  the oracle at `oracle_reach`; other arms as GRPO."""
  evidence = {}
  for regime in ("uniform_filler", "peaked_filler"):
    for g in (4, 8):
      plateaus = {arm: verdicts.stream(regime, g, arm).uniform(0.5, 0.9, 8) for arm in arms}
      curves = {arm: {s: _curve(plateaus[arm][s], oracle_reach if arm == "oracle" else 6)
                      for s in range(8)} for arm in arms}
      evidence.setdefault(regime, {})[g] = verdicts.cell_evidence(
          curves, verdicts.stream(regime, g))
  return evidence


def test_each_claim_is_one_holm_family_and_the_primary_claims_are_gated_in_order():
  evidence = _evidence(oracle_reach=2)
  decided = {claim.name: tests for claim, tests in verdicts.correct(evidence)}
  speed, slope, every_g = (decided[c.name] for c in verdicts.CLAIMS[:3])
  assert [where for where, _ in speed] == ["uniform_filler, G = 8", "peaked_filler, G = 8"]
  assert [t["verdict"] for _, t in speed] == ["higher", "higher"]
  assert [where for where, _ in slope] == ["uniform_filler", "peaked_filler"]
  assert not any(t["verdict"].startswith("not tested") for _, t in slope)
  # A claim's correction runs over its own cells: 4 here, whatever else the cells hold.
  np.testing.assert_allclose([t["p_holm"] for _, t in every_g],
                             statistics.holm([t["p"] for _, t in every_g]))
  cell = evidence["uniform_filler"][4]["auc"]["oracle"]
  assert cell["family"] == verdicts.CLAIMS[2].name and cell["verdict"] == "higher"
  # Exploratory: what no claim holds (the oracle's final J is in a claim; nothing else is).
  exploratory = [by_g[g][m][arm] for by_g in evidence.values() for g in by_g
                 for m in verdicts.METRICS for arm in by_g[g][m]
                 if by_g[g][m][arm]["family"] == "exploratory"]
  assert exploratory == []
  # When the first primary claim does not hold, the second is not tested.
  failed = {claim.name: tests for claim, tests in verdicts.correct(_evidence(oracle_reach=6))}
  assert not all(t["verdict"] == "higher" for _, t in failed[verdicts.CLAIMS[0].name])
  assert all(t["verdict"].startswith("not tested") for _, t in failed[verdicts.CLAIMS[1].name])


def test_a_claims_verdicts_do_not_depend_on_how_many_arms_a_cell_holds():
  two = verdicts.correct(_evidence(2))
  evidence = _evidence(2, arms=("grpo", "oracle", "oracle_shuffled", "ktae", "entropy80"))
  more = verdicts.correct(evidence)
  assert [(c.name, [(w, t["verdict"], t["p_holm"]) for w, t in tests]) for c, tests in two] == [
      (c.name, [(w, t["verdict"], t["p_holm"]) for w, t in tests]) for c, tests in more]
  # The added arms are exploratory: one Holm family across every cell and metric.
  added = [e[m][arm] for by_g in evidence.values() for e in by_g.values()
           for m in verdicts.METRICS for arm in ("oracle_shuffled", "ktae", "entropy80")]
  assert {c["family"] for c in added} == {"exploratory"} and len(added) == 24
  np.testing.assert_allclose([c["p_holm"] for c in added],
                             statistics.holm([c["p"] for c in added]))


def test_the_verdicts_read_every_workdirs_cells_regress_on_log_g_and_draw_the_figure(tmp_path):
  rng = np.random.default_rng(1)
  first, second = tmp_path / "small", tmp_path / "regimes"
  truth = []
  for g in (4, 8, 16):
    # oracle - GRPO on final J: 0.3 - 0.1 log2 G plus noise, per seed.
    gap = 0.3 - 0.1 * np.log2(g) + rng.normal(0, 0.05, 6)
    truth += [(np.log2(g), d) for d in gap]
    _write(first, "a", g, {"grpo": {s: _curve(0.6 - gap[s], 3) for s in range(6)},
                           "oracle": {s: _curve(0.6, 3) for s in range(6)}})
  _write(second, "b", 8, {"grpo": {s: _curve(0.5, 3) for s in range(3)},
                          "oracle": {s: _curve(0.6, 3) for s in range(3)}})
  evidence = verdicts.write([first, second], tmp_path / "out")
  assert sorted(evidence) == ["a", "b"] and sorted(evidence["a"]) == [4, 8, 16]
  text = (tmp_path / "out" / "verdicts.md").read_text()
  x, y = np.asarray(truth).T
  row = next(line for line in text.splitlines()
             if line.startswith("| a | oracle − GRPO, final J |"))
  assert f"| {np.polyfit(x, y, 1)[0]:+.3f} [" in row
  assert "| b | 8 | 0.500 (0.500) | 0.100 (n/a), n/a (below 5 seeds) |" in text
  assert (tmp_path / "out" / "differences.png").stat().st_size > 0
  # Each comparison draws its own bootstrap stream: regime a's intervals do not move when
  # another regime's workdir (6 seeds: bootstrapped) is read first or left out (its
  # exploratory verdicts may: their Holm family spans every cell read).
  third = tmp_path / "third"
  _write(third, "c", 8, {"grpo": {s: _curve(0.5 - 0.01 * s, 3) for s in range(6)},
                         "oracle": {s: _curve(0.6, 3) for s in range(6)}})
  verdicts.write([third, first], tmp_path / "b_first")
  verdicts.write([first], tmp_path / "alone")
  rows = lambda path: [re.findall(r"-?\d\.\d{3} \[[^]]+\]", line)
                       for line in (path / "verdicts.md").read_text().splitlines()
                       if line.startswith("| a |")]
  assert rows(tmp_path / "alone") == rows(tmp_path / "b_first") == rows(tmp_path / "out")
  assert len(rows(tmp_path / "out")) > 3


def test_a_regime_in_two_workdirs_or_a_workdir_without_cells_is_refused(tmp_path):
  for workdir in (tmp_path / "one", tmp_path / "two"):
    _write(workdir, "a", 4, {"grpo": {0: _curve(0.5, 3)}})
  with pytest.raises(ValueError, match="Regime 'a' is in both"):
    verdicts.read_cells([tmp_path / "one", tmp_path / "two"])
  with pytest.raises(ValueError, match="holds no cells"):
    verdicts.read_cells([tmp_path / "empty"])


def test_a_numbered_family_of_arms_is_ordered_by_its_number():
  assert verdicts._ordered(["oracle", "oracle_mc_1", "oracle_mc_16", "grpo", "oracle_mc_4"]) == [
      "oracle", "oracle_mc_1", "oracle_mc_4", "oracle_mc_16", "grpo"]


def test_a_claim_can_compare_two_arms_other_than_grpo():
  """The same-rate controls: `base` names the arm the claim's arm is paired against."""
  evidence = _evidence(6, arms=("grpo", "oracle", "grpo_at_1e-3"))
  claim = verdicts.Claim("same rate", "oracle", "final", (("uniform_filler", 4),),
                         base="grpo_at_1e-3")
  [(where, test, key)] = verdicts._claim_tests(claim, evidence)
  summary = evidence["uniform_filler"][4]["summary"]
  d = [summary["oracle"][s]["final"] - summary["grpo_at_1e-3"][s]["final"] for s in range(8)]
  assert where == "uniform_filler, G = 4" and key is None  # no cell comparison holds it
  assert test["delta"][0] == pytest.approx(np.mean(d))
  assert test["p"] == statistics.sign_flip_p(d)
