"""The credit sweep's report tables (lab.sweep_tables)."""

import numpy as np
import pytest

from jaxcredit.lab import diagnostics, outcomes, statistics
from studies.credit_study import tables


def _summary(deltas: dict, seeds: int = 10) -> dict:
  rng = np.random.default_rng(0)
  base = rng.uniform(0.2, 0.4, seeds)
  make = lambda values: {s: {"final": float(v)} for s, v in enumerate(values)}
  return {"grpo": make(base), **{arm: make(base + d + rng.normal(0, noise, seeds))
                                 for arm, (d, noise) in deltas.items()}}


def test_comparisons_call_higher_lower_negligible_or_inconclusive_after_holm():
  summary = _summary({"better": (0.2, 0.02), "worse": (-0.2, 0.02), "same": (0.0, 0.005),
                      "noisy": (0.0, 0.3), "slightly": (0.01, 0.002)})
  out = tables.compare(summary, "final", 0.05, np.random.default_rng(0))
  # "slightly" is significant (all ten differences positive) but inside the margin.
  assert [out[a]["verdict"] for a in ("better", "worse", "same", "noisy", "slightly")] == [
      "higher", "lower", "negligible", "inconclusive", "negligible"]
  assert out["slightly"]["p_holm"] <= tables.VERDICT_ALPHA
  np.testing.assert_allclose([out[a]["p_holm"] for a in out],
                             statistics.holm([out[a]["p"] for a in out]))
  np.testing.assert_allclose([out[a]["p_tost_holm"] for a in out],
                             statistics.holm([out[a]["p_tost"] for a in out]))
  low, high = out["better"]["delta"][1:]
  assert low < 0.2 < high
  d = [summary["better"][s]["final"] - summary["grpo"][s]["final"] for s in range(10)]
  assert out["better"]["delta"] == statistics.bootstrap_ci(d, np.random.default_rng(0), 10000,
                                                           "BCa")
  few = tables.compare(_summary({"better": (0.2, 0.02)}, seeds=3), "final", 0.05,
                             np.random.default_rng(0))
  assert few["better"]["delta"][1:] == (None, None)  # n/a below 5 seeds, never a range
  assert few["better"]["verdict"] == "n/a (below 5 seeds)"


def test_both_arms_at_the_ceiling_read_ceiling_on_final_j_only():
  rng = np.random.default_rng(0)
  make = lambda values: {s: {"final": float(v), "auc": float(v) - 0.5} for s, v in
                         enumerate(values)}
  summary = {"grpo": make(rng.uniform(0.985, 1.0, 10)),
             "oracle": make(rng.uniform(0.985, 1.0, 10) + 0.0),
             "below": make(rng.uniform(0.95, 0.97, 10))}
  final = tables.compare(summary, "final", 0.05, rng)
  assert final["oracle"]["verdict"] == "ceiling" and final["oracle"]["at_ceiling"]
  assert final["below"]["verdict"] != "ceiling"
  assert tables.compare(summary, "auc", 0.05, rng)["oracle"]["verdict"] != "ceiling"


def test_the_budget_check_compares_z_with_grpos_median_tokens_to_the_level():
  summary = {"grpo": {s: {"tau": t} for s, t in enumerate([100, 300, None, 200])}}
  text = tables.budget_check(summary, 0.85, 600)
  assert "after 200 tokens (median of the 3/4 seeds that do): Z = 3.0 ×" in text
  summary = {"grpo": {0: {"tau": None}}}
  assert tables.budget_check(summary, 0.85, 600) == (
      "Budget: GRPO did not reach J = 0.850 within Z = 600 tokens.")


def test_busy_time_is_the_union_of_the_pieces_spans():
  """Overlapping pieces count once, a pause between sessions not at all (float64 loop over
  one-second ticks as the reference)."""
  rng = np.random.default_rng(0)
  for _ in range(20):
    starts = rng.integers(0, 200, 6)
    spans = [(float(s), float(s + rng.integers(0, 40))) for s in starts]
    ticks = {t for start, end in spans for t in range(int(start), int(end))}
    assert tables.busy_seconds(spans) == len(ticks)
  assert tables.busy_seconds([(0.0, 10.0), (5.0, 20.0), (1000.0, 1010.0)]) == 30.0


def test_localisation_regresses_the_gain_on_log_g_and_on_grpos_gradient_noise():
  rng = np.random.default_rng(1)
  summaries, curves, truth = {}, {}, []
  for g in (4, 8, 16, 32):
    share = rng.uniform(0.5, 0.9, 10)  # GRPO's filler share at the start, per seed
    gain = 0.3 - 0.05 * np.log2(g) + 0.2 * share + rng.normal(0, 0.01, 10)
    summaries[g] = {"oracle_seq": {s: {"final": 0.5, "auc": 0.2} for s in range(10)},
                    "oracle": {s: {"final": 0.5 + gain[s], "auc": 0.2 + gain[s]}
                               for s in range(10)}}
    curves[g] = {"grpo": {s: {"filler_norm": [share[s], 0.0], "decisive_norm":
                              [1 - share[s], 1.0], "signal_fraction": [0.1, 0.5]}
                          for s in range(10)}}
    truth += [(np.log2(g), share[s], gain[s]) for s in range(10)]
  lines, slopes, rows = tables.localisation({"r": summaries}, {"r": curves},
                                                  np.random.default_rng(0))
  x_g, x_share, y = np.asarray(truth).T
  for name, x in (("log₂ G", x_g), ("GRPO's filler share at the start", x_share)):
    slope, low, high = slopes[("r", "auc", name)]
    assert slope == pytest.approx(np.polyfit(x, y, 1)[0], rel=1e-9)  # OLS of the pairs
    assert low < slope < high
  assert slopes[("r", "auc", "log₂ G")][2] < 0  # the gain falls with G here
  # A regressor that does not vary (the signal fraction) gets no slope.
  assert ("r", "auc", "GRPO's signal fraction at the start") not in slopes
  assert len(rows) == 40 and lines[2].startswith("| r | 4 | ")
  assert lines[2].endswith(f" | {np.mean(x_share[:10]):.2f} | 0.10 | — |")


def test_the_alignment_check_ranks_grpos_starting_cosine_against_the_oracles_speed_up():
  summaries, curves = {"r": {}}, {"r": {}}
  for g, cosine, speedup in ((4, 0.1, 4.0), (8, 0.2, 3.0), (16, 0.3, 2.0), (32, 0.4, None)):
    tau = lambda arm, s: (None if speedup is None and arm == "oracle" else
                          100.0 * s * (speedup or 1) if arm == "grpo" else 100.0 * s)
    summaries["r"][g] = {arm: {s: {"tau": tau(arm, s)} for s in (1, 2, 3)}
                         for arm in ("grpo", "oracle")}
    curves["r"][g] = {"grpo": {s: {"cosine_to_exact": [cosine + 0.01 * s, 0.9]}
                               for s in (1, 2, 3)}}
  lines = tables.alignment_check(summaries, curves)
  assert lines[2] == "| r | 4 | 0.12 | 4.0× |" and lines[5] == "| r | 32 | 0.42 | — |"
  assert lines[-1].startswith("Across the 3 cells, Spearman's ρ of GRPO's starting cosine "
                              "with the oracle's speed-up = -1.00")
  del summaries["r"][8]
  assert tables.alignment_check(summaries, curves)[-1] == (
      "(Spearman's ρ needs 3 cells where both arms reach the level; 2 here.)")


def test_the_charged_table_reads_monte_carlo_runs_at_grpos_budget_of_charged_tokens():
  grpo = {s: {"success": [0.1, 0.5, 0.9 - s / 10], "gen_tokens": [0, 100, 200]} for s in (0, 1)}
  ladder = {s: {"success": [0.1, 0.3 + s / 10, 0.6], "gen_tokens": [0, 100, 200],
                "charged_tokens": [0, 1000, 2000]} for s in (0, 1)}
  lines = tables.charged_table({"grpo": grpo, "oracle_mc_1": ladder, "oracle": grpo},
                                     200, np.random.default_rng(0))
  # At 200 charged tokens the ladder runs are a fifth of the way to their first measurement:
  # J = 0.1 + 0.2 (0.2 + s / 10), s = 0, 1; GRPO ends at 0.9 and 0.8.
  at_budget = [0.1 + 0.2 * 0.2, 0.1 + 0.2 * 0.3]
  delta = np.mean(at_budget) - np.mean([0.9, 0.8])
  assert len(lines) == 5 and lines[-1].startswith("| oracle_mc_1 | 2,000 | 10.0 | 20 | ")
  assert f"{np.mean(at_budget):.3f} (n/a)" in lines[-1] and f"{delta:.3f} (n/a)" in lines[-1]
  assert tables.charged_table({"grpo": grpo, "oracle": grpo}, 200,
                                    np.random.default_rng(0)) == []


def test_the_flops_table_reads_each_arm_at_grpos_charged_flops():
  grpo = {s: {"success": [0.1, 0.5, 0.9 - s / 10], "updates": [0, 10, 20],
              "charged_flops": [0.0, 1e9, 2e9]} for s in (0, 1)}
  strided = {s: {"success": [0.1, 0.3 + s / 10, 0.6], "updates": [0, 10, 20],
                 "charged_flops": [0.0, 4e9, 8e9]} for s in (0, 1)}
  curves = {"grpo": grpo, "mc_4_stride_6": strided, "oracle": grpo}
  lines = tables.flops_table(curves, np.random.default_rng(0))
  # GRPO spends 2e9 a run; the strided arm 4x as much, so it is read after 5 of its updates,
  # half way to its first measurement: J = 0.1 + 0.5 (0.2 + s / 10); GRPO ends at 0.9, 0.8.
  at_budget = [0.1 + 0.5 * 0.2, 0.1 + 0.5 * 0.3]
  delta = np.mean(at_budget) - np.mean([0.9, 0.8])
  assert "GRPO at its 2e+09 FLOPs per run" in lines[0]
  assert len(lines) == 5 and lines[-1].startswith("| mc_4_stride_6 | 8e+09 | 4.0 | 5 | ")
  assert f"{np.mean(at_budget):.3f} (n/a)" in lines[-1] and f"{delta:.3f} (n/a)" in lines[-1]
  # No arm charged more than GRPO: no table.
  assert tables.flops_table({"grpo": grpo, "oracle": grpo}, np.random.default_rng(0)) == []
  # Cells run before runs recorded their FLOPs have no such table.
  del strided[1]["charged_flops"]
  assert tables.flops_table(curves, np.random.default_rng(0)) == []


def test_the_ranking_table_lists_the_arms_that_trained_a_critic():
  run = lambda shift: {"mechanism_gen_tokens": [0, 5000], "critic_top1": [0.25, 0.5 + shift],
                       **{name: [0.25, 0.75] for name in diagnostics.RANKING[1:]}}
  lines = tables.ranking_table({"grpo": {0: {"gen_tokens": [0]}},
                                      "ppo_gae": {0: run(0.0), 1: run(0.1)}})
  assert "after 0k / 5k generated tokens" in lines[0]
  assert lines[2] == "| arm | critic | random | mc1 | mc4 | mc16 | mc64 |"
  assert lines[-1] == "| ppo_gae | 0.25 / 0.55 | " + " | ".join(["0.25 / 0.75"] * 5) + " |"
  assert tables.ranking_table({"grpo": {0: {"gen_tokens": [0]}}}) == []


def test_stall_rows_count_stalls_and_solves_and_pair_them_by_seed():
  make = lambda finals: {s: {"final": f} for s, f in enumerate(finals)}
  summary = {"grpo": make([0.1, 0.2, 0.3, 0.95, 0.97, 0.6]),
             "oracle": make([0.99, 0.95, 0.92, 0.96, 0.4, 0.91])}
  grpo, oracle = tables.stall_rows("r", 8, summary)
  assert grpo == "| r | 8 | grpo | 3/6 | 2/6 | — | — |"
  # Discordant seeds: GRPO alone stalls on 0, 1, 2; the oracle alone on 4: 2 P(Bin(4) <= 1).
  p = outcomes.paired_binary_p([False, False, False, False, True, False],
                                 [True, True, True, False, False, False])
  assert p == pytest.approx(2 * 5 / 16)
  assert oracle == (f"| r | 8 | oracle | 1/6 | 5/6 | {p:.4f} | "
                    f"{outcomes.seeds_for_power(1 / 6, 3 / 6)} |")


def test_the_key_table_says_whether_stalled_runs_hold_wrong_or_undecided_keys():
  """Two prompts, two decisive positions, |C| = 2 (right keys: 0 then 1, and 1 then 1)."""
  targets = [[0, 1], [1, 1]]
  uniform = [[[0.5, 0.5], [0.5, 0.5]], [[0.5, 0.5], [0.5, 0.5]]]
  wrong = [[[0.1, 0.9], [0.8, 0.2]], [[0.5, 0.5], [0.6, 0.4]]]  # 2 wrong, 1 undecided, 1 wrong
  right = [[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.3, 0.7]]]
  run = lambda keys: {"final_keys": keys, "key_targets": targets}
  curves = {"grpo": {0: run(uniform), 1: run(wrong), 2: run(right)},
            "oracle": {0: run(right)}}
  summary = {"grpo": {0: {"final": 0.25}, 1: {"final": 0.3}, 2: {"final": 0.95}},
             "oracle": {0: {"final": 0.95}}}
  lines = tables.key_table(curves, summary)
  assert lines[2] == ("| arm | outcome | runs | key entropy k = 1 | key entropy k = 2 | "
                      "right key | wrong key | undecided |")
  entropy = lambda p: -np.sum(np.where(np.asarray(p) > 0, p * np.log(np.maximum(p, 1e-300)), 0))
  # Stalled: the uniform run (every pair undecided at ln 2, which is at least 1/2 for the
  # right key: ties count as right) and the wrong one.
  h1 = np.mean([np.log(2), np.log(2), entropy([0.1, 0.9]), np.log(2)])
  h2 = np.mean([np.log(2), np.log(2), entropy([0.8, 0.2]), entropy([0.6, 0.4])])
  # Right key >= 1/2: the uniform run's 4 pairs and the wrong run's (prompt 1, k = 1); wrong:
  # (0, 1), (0, 2), (1, 2) of the wrong run.
  assert lines[4] == f"| grpo | stalled | 2 | {h1:.2f} | {h2:.2f} | 0.62 | 0.38 | 0.00 |"
  h = [np.mean([0.0, 0.0]), np.mean([0.0, entropy([0.3, 0.7])])]
  assert lines[5] == f"| grpo | solved | 1 | {h[0]:.2f} | {h[1]:.2f} | 1.00 | 0.00 | 0.00 |"
  assert lines[6].startswith("| oracle | solved | 1 | ") and len(lines) == 7
  del curves["oracle"][0]["final_keys"]  # a cell run before the keys were recorded
  assert tables.key_table(curves, summary) == []


def test_final_j_is_the_mean_over_the_last_tenth_of_the_updates():
  """Evenly spaced: the last 3 of 20 measurements. Log-spaced: the last only (the last 3
  reach back over a third of the run)."""
  from studies.credit_study import report
  even = {"updates": list(range(0, 210, 10)), "success": [0.0] * 18 + [0.5, 0.6, 0.7]}
  logs = {"updates": [0, 1, 3, 10, 30, 100, 400, 650, 1000],
          "success": [0.0, 0, 0, 0, 0, 0.1, 0.2, 0.4, 0.9]}
  curves = {"grpo": {0: even, 1: logs}}
  for curve in (even, logs):
    curve.update({"pass@k": {"4": curve["success"]}, "gen_tokens": curve["updates"],
                  "zero_variance_groups": 0.5})
  summary, _ = report.summarise(curves, final_share=tables.FINAL_SHARE)
  assert summary["grpo"][0]["final"] == pytest.approx(0.6)
  assert summary["grpo"][1]["final"] == pytest.approx(0.9)
  assert summary["grpo"][1]["pass@k"]["4"] == pytest.approx(0.9)
  default, _ = report.summarise(curves)  # the last 3, as the runner's fixed-interval curves
  assert default["grpo"][1]["final"] == pytest.approx(0.5)


def test_implicit_credit_rows_pair_the_gain_by_seed():
  run = lambda raw, seen: {"credit_cosine": [raw, 0.1, 0.0],
                           "implicit_credit_cosine": [seen, 0.3, 0.0],
                           "mechanism_gen_tokens": [0, 2000, 9000]}
  raw, seen = np.random.default_rng(1).uniform(0.1, 0.3, (2, 6))
  grpo = {s: run(raw[s], seen[s]) for s in range(6)}
  rows = tables.implicit_credit_rows("visible", 8, grpo, np.random.default_rng(0))
  want = statistics.reported_ci(seen - raw, np.random.default_rng(0), 10000, method="BCa")
  assert rows[0].startswith(f"| visible | 8 | 6 | start | 0k | {raw.mean():.3f} | "
                            f"{seen.mean():.3f} | ")
  assert rows[0].endswith(f" | {want[0]:.3f} [{want[1]:.3f}, {want[2]:.3f}] |")
  assert rows[1].startswith("| visible | 8 | 6 | second | 2k | 0.100 | 0.300 | 0.200 ")
  assert tables.implicit_credit_rows("blind", 8, {0: {"credit_cosine": [0.1]}}, None) == []
