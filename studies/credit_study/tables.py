"""The credit sweep's report tables (`sweep.write_report`): paired comparisons with
GRPO (bootstrap intervals, sign-flip p-values Holm-adjusted across a cell's arms, TOST
equivalence), J at equal charged tokens, the budget check, the gradient measurements, the
critic's ranking, and the localisation gain Delta_loc = oracle - oracle_seq against G and
GRPO's gradient noise (table, slopes, figure), with the mechanism's prediction checked.
"""

import pathlib

import numpy as np
import scipy.stats

from jaxcredit.lab import diagnostics, outcomes, statistics
from studies.credit_study import report

VERDICT_ALPHA = 0.05
STALL, SOLVE = 0.5, 0.9  # a run stalls below this final J, solves at or above that one
# Final J: the mean over the last 10% of a run's updates (the last 3 of 20 evenly spaced
# measurements; with log-spaced ones, the last: the last 3 would reach back over a third).
FINAL_SHARE = 0.1
CEILING = 0.98  # both arms' mean final J at or above it: the cell cannot tell them apart
INTERVAL = "BCa"


def paired(summary: dict, metric: str, margin: float, rng, base: str = "grpo") -> dict:
  """{arm: {"delta": (mean, low, high), "p", "p_tost", "at_ceiling"}} of each arm's
  per-seed `metric` minus `base`'s (GRPO's) on the same seeds, before any correction for
  multiplicity (BCa intervals, sign-flip p, TOST by sign flips at +-margin)."""
  base_name, base = base, summary[base]
  out = {}
  for arm, per_seed in summary.items():
    if arm == base_name:
      continue
    seeds = sorted(set(per_seed) & set(base))
    d = np.asarray([per_seed[s][metric] - base[s][metric] for s in seeds])
    means = [np.mean([runs[s][metric] for s in seeds]) for runs in (per_seed, base)]
    out[arm] = {"delta": statistics.reported_ci(d, rng, 10000, INTERVAL),
                "p": statistics.sign_flip_p(d, rng), "p_tost": statistics.tost(d, margin, rng),
                "at_ceiling": metric == "final" and min(means) >= CEILING}
  return out


def decide(comparisons: list[dict], margin: float) -> None:
  """Holm across `comparisons` (one family: their p and their TOST p), then each one's
  `statistics.verdict`; writes "p_holm", "p_tost_holm" and "verdict" into each."""
  if not comparisons:
    return
  p_holm = statistics.holm([c["p"] for c in comparisons])
  p_tost_holm = statistics.holm([c["p_tost"] for c in comparisons])
  for c, p, p_tost in zip(comparisons, p_holm, p_tost_holm):
    c["p_holm"], c["p_tost_holm"] = float(p), float(p_tost)
    c["verdict"] = statistics.verdict(c["delta"], p, p_tost, margin, alpha=VERDICT_ALPHA,
                                      at_ceiling=c["at_ceiling"])
    if c["verdict"] == "n/a":
      c["verdict"] = f"n/a (below {statistics.MIN_SEEDS} seeds)"


def compare(summary: dict, metric: str, margin: float, rng) -> dict:
  """`paired`, with Holm across the cell's arms and each arm's verdict (`decide`)."""
  out = paired(summary, metric, margin, rng)
  decide(list(out.values()), margin)
  return out


def comparison_table(comparisons: dict, metric: str) -> list[str]:
  lines = [f"| arm | Δ {metric} vs grpo [95% BCa CI] | p (sign-flip) | p (Holm) | "
           "p (TOST, Holm) | verdict |", "|---|---|---|---|---|---|"]
  for arm, c in comparisons.items():
    lines.append(f"| {arm} | {report.fmt_interval(*c['delta'])} | {c['p']:.4f} | "
                 f"{c['p_holm']:.4f} | {c['p_tost_holm']:.4f} | {c['verdict']} |")
  return lines


def _at_budget(runs: dict, grpo: dict, spent, budget: float) -> tuple[list, np.ndarray,
                                                                      np.ndarray]:
  """An arm's J read at `budget` of what `spent(curve)` counts (linear between its
  measurements), paired by seed with GRPO's final J: ``(seeds, J at the budget, difference)``."""
  seeds = sorted(set(runs) & set(grpo))
  at_budget = np.asarray([np.interp(budget, spent(runs[s]), runs[s]["success"]) for s in seeds])
  return seeds, at_budget, at_budget - np.asarray([grpo[s]["success"][-1] for s in seeds])


def _matched_columns(at_budget: np.ndarray, difference: np.ndarray, rng) -> str:
  """The J-at-the-budget, difference and sign-flip columns of an equal-compute row."""
  return (f"{report.fmt_interval(*statistics.reported_ci(at_budget, rng, 10000))} | "
          f"{report.fmt_interval(*statistics.reported_ci(difference, rng, 10000))} | "
          f"{statistics.sign_flip_p(difference, rng):.4f} |")


def charged_table(curves: dict, budget: float, rng) -> list[str]:
  """The arms charged for more tokens than they sample (Monte-Carlo continuations) against
  GRPO at equal charged tokens: per arm, the tokens charged per run and their multiple of
  its samples, the samples that fit in the cell's `budget` of charged tokens, and J at that
  budget (each run's curve read at charged = budget, linear between its measurements)
  paired by seed with GRPO's J at the end of its run (which spends exactly the budget).
  Empty when no arm is charged more or GRPO is not in the cell."""
  charged = {arm: runs for arm, runs in curves.items()
             if any("charged_tokens" in curve for curve in runs.values())}
  if not charged or "grpo" not in curves:
    return []
  lines = ["At equal charged tokens (sampled + Monte-Carlo continuations), against GRPO at "
           f"the cell's budget of {budget:,.0f}:", "",
           "| arm | charged tokens / run | × its samples | samples within the budget | "
           "J at the budget [95% CI] | Δ vs grpo [95% CI] | p (sign-flip) |",
           "|---|---|---|---|---|---|---|"]
  tokens = lambda curve: curve.get("charged_tokens", curve["gen_tokens"])
  for arm, runs in charged.items():
    seeds, at_budget, difference = _at_budget(runs, curves["grpo"], tokens, budget)
    spent = [tokens(runs[s]) for s in seeds]
    multiple = np.mean([t[-1] / runs[s]["gen_tokens"][-1] for t, s in zip(spent, seeds)])
    lines.append(
        f"| {arm} | {np.mean([t[-1] for t in spent]):,.0f} | {multiple:.1f} | "
        f"{budget / multiple:,.0f} | {_matched_columns(at_budget, difference, rng)}")
  return lines


def flops_table(curves: dict, rng) -> list[str]:
  """The arms charged more model FLOPs than GRPO (Monte-Carlo continuations, a critic, a
  PRM: `jaxcredit.lab.compute`) against GRPO at equal charged FLOPs: per arm, its FLOPs
  per run and their multiple of GRPO's, the updates it takes within GRPO's FLOPs per run
  (the budget), and J there (read as in `charged_table`) paired by seed with GRPO's final
  J. Empty unless every run of the cell records its charged FLOPs (cells run before they
  were recorded), GRPO is in the cell and some arm is charged more than it."""
  if "grpo" not in curves or not all("charged_flops" in curve for runs in curves.values()
                                     for curve in runs.values()):
    return []
  budget = float(np.mean([c["charged_flops"][-1] for c in curves["grpo"].values()]))
  flops = lambda curve: curve["charged_flops"]
  rows = []
  for arm, runs in curves.items():
    spent = np.mean([flops(curve)[-1] for curve in runs.values()])
    if arm == "grpo" or spent <= budget * (1 + 1e-6):
      continue
    seeds, at_budget, difference = _at_budget(runs, curves["grpo"], flops, budget)
    updates = np.mean([np.interp(budget, flops(runs[s]), runs[s]["updates"]) for s in seeds])
    rows.append(f"| {arm} | {spent:.3g} | {spent / budget:.1f} | {updates:,.0f} | "
                f"{_matched_columns(at_budget, difference, rng)}")
  if not rows:
    return []
  return ["At equal charged FLOPs (model FLOPs of sampling, the learner's step and what the "
          f"arm reads), against GRPO at its {budget:.3g} FLOPs per run:", "",
          "| arm | charged FLOPs / run | × GRPO's | updates within the budget | "
          "J at the budget [95% CI] | Δ vs grpo [95% CI] | p (sign-flip) |",
          "|---|---|---|---|---|---|---|", *rows]


LOCALISED = ("final", "auc")  # the metrics Delta_loc is taken on
FILLER_SHARE, SIGNAL_FRACTION, NOISY_TOKENS = (  # its regressors
    "GRPO's filler share at the start", "GRPO's signal fraction at the start",
    "GRPO's effective noisy tokens")


def filler_share(run: dict) -> np.ndarray:
  """|g_filler| / (|g_filler| + |g_decisive|) at each gradient measurement of a run."""
  filler, decisive = np.asarray(run["filler_norm"]), np.asarray(run["decisive_norm"])
  return filler / np.maximum(filler + decisive, 1e-30)


def _localisation_runs(summaries: dict, curves: dict) -> list[dict]:
  """One row per (regime, G, seed) with oracle and oracle_seq: Delta_loc = oracle -
  oracle_seq on each LOCALISED metric, and the regressors of that seed: log2 G, GRPO's
  effective noisy tokens (mean over its updates) and, where the cell measured gradients,
  GRPO's filler share and signal fraction at the first measurement (the start of
  training)."""
  rows = []
  for regime, by_g in summaries.items():
    for g, summary in sorted(by_g.items()):
      if not {"oracle", "oracle_seq"} <= set(summary):
        continue
      grpo = curves[regime][g].get("grpo", {})
      for seed in sorted(set(summary["oracle"]) & set(summary["oracle_seq"])):
        x = {"log₂ G": float(np.log2(g))}
        if "noisy_tokens" in grpo.get(seed, {}):
          x[NOISY_TOKENS] = float(grpo[seed]["noisy_tokens"])
        if "filler_norm" in grpo.get(seed, {}):
          x[FILLER_SHARE] = float(filler_share(grpo[seed])[0])
          x[SIGNAL_FRACTION] = float(grpo[seed]["signal_fraction"][0])
        rows.append({"regime": regime, "g": g, "x": x, "delta": {
            m: summary["oracle"][seed][m] - summary["oracle_seq"][seed][m] for m in LOCALISED}})
  return rows


def localisation(summaries: dict, curves: dict, rng) -> tuple[list[str], dict, list[dict]]:
  """The localisation gain Delta_loc = oracle - oracle_seq (paired by seed) on final J and
  AUC per (regime, G), with GRPO's gradient noise there; and Delta_loc's OLS slope on each
  regressor of `_localisation_runs` (per regime, and over every regime when there are
  several), with a bootstrap interval over runs. H2 predicts a negative slope on log2 G
  (more samples average the filler noise away) and positive ones on GRPO's filler share
  and noisy tokens.
  Returns (table lines, {(group, metric, regressor): (slope, low, high)}, the runs)."""
  rows = _localisation_runs(summaries, curves)
  lines = ["| regime | G | Δ_loc = oracle − oracle_seq, final J [95% CI] | p (sign-flip) | "
           f"Δ_loc, AUC [95% CI] | p (sign-flip) | {FILLER_SHARE} | {SIGNAL_FRACTION} | "
           f"{NOISY_TOKENS} |", "|---|---|---|---|---|---|---|---|---|"]
  for regime, g in dict.fromkeys((r["regime"], r["g"]) for r in rows):
    cell = [r for r in rows if (r["regime"], r["g"]) == (regime, g)]
    stats = []
    for metric in LOCALISED:
      d = np.asarray([r["delta"][metric] for r in cell])
      stats += [report.fmt_interval(*statistics.reported_ci(d, rng, 10000)),
                f"{statistics.sign_flip_p(d, rng):.4f}"]
    noise = [f"{np.mean([r['x'][name] for r in cell]):.2f}" if name in cell[0]["x"] else "—"
             for name in (FILLER_SHARE, SIGNAL_FRACTION, NOISY_TOKENS)]
    lines.append(f"| {regime} | {g} | " + " | ".join(stats + noise) + " |")
  groups = {regime: [r for r in rows if r["regime"] == regime]
            for regime in dict.fromkeys(r["regime"] for r in rows)}
  if len(groups) > 1:
    groups["every regime"] = rows
  slopes = {}
  for group, members in groups.items():
    for name in members[0]["x"] if members else ():
      if not all(name in r["x"] for r in members):
        continue
      x = np.asarray([r["x"][name] for r in members])
      if np.ptp(x) == 0:
        continue
      for metric in LOCALISED:
        y = np.asarray([r["delta"][metric] for r in members])
        slopes[(group, metric, name)] = statistics.ols_slope(x, y, rng)
  return lines, slopes, rows


IMPLICIT_HEADER = ["| regime | G | seeds | at | tokens | raw | as the gradient sees it | "
                   "gain [95% BCa] |", "|---|---|---|---|---|---|---|---|"]


def implicit_credit_rows(regime: str, g: int, grpo: dict, rng) -> list[str]:
  """GRPO's implicit process reward in one cell: at the first two gradient measurements,
  the cosine of its credit with the exact credit, raw and as the gradient sees it (each
  token's credit averaged over the group's responses that share its state and take it),
  and the gain, paired by seed; no rows when the runs did not measure it."""
  runs = [run for run in grpo.values() if "implicit_credit_cosine" in run]
  if not runs:
    return []
  rows = []
  for i, at in enumerate(("start", "second")):
    raw = np.array([run["credit_cosine"][i] for run in runs])
    seen = np.array([run["implicit_credit_cosine"][i] for run in runs])
    tokens = np.mean([run["mechanism_gen_tokens"][i] for run in runs])
    gain = statistics.reported_ci(seen - raw, rng, 10000, method=INTERVAL)
    rows.append(f"| {regime} | {g} | {len(runs)} | {at} | {tokens / 1000:.0f}k | "
                f"{raw.mean():.3f} | {seen.mean():.3f} | {report.fmt_interval(*gain)} |")
  return rows


def time_to_level(per_seed: dict) -> dict:
  """{"tokens", "updates"}: `outcomes.time_to_level` of an arm's runs ({seed: summary}),
  in generated tokens and in updates, each run that never reaches the level censored at its
  budget."""
  runs = list(per_seed.values())
  reached = [m["tau"] is not None for m in runs]
  return {unit: outcomes.time_to_level(
      [m[tau] if m[tau] is not None else m[final] for m in runs], reached)
      for unit, tau, final in (("tokens", "tau", "gen_tokens"),
                               ("updates", "tau_updates", "updates"))}


def stall_rows(regime: str, g: int, summary: dict) -> list[str]:
  """Per arm of the core comparisons: its stalls (final J < STALL) and solves (>= SOLVE)
  out of its runs, the exact McNemar p of its stalls against GRPO's on the same seeds, and
  the seeds per arm at which Fisher's exact test would see the two stall rates apart (80%
  power)."""
  base = summary["grpo"]
  rows = []
  for arm in ("grpo", "oracle", "oracle_seq"):
    if arm not in summary:
      continue
    finals = np.asarray([m["final"] for m in summary[arm].values()])
    row = [regime, str(g), arm, f"{np.sum(finals < STALL)}/{len(finals)}",
           f"{np.sum(finals >= SOLVE)}/{len(finals)}"]
    if arm == "grpo":
      row += ["—", "—"]
    else:
      seeds = sorted(set(summary[arm]) & set(base))
      stalled = lambda runs: np.asarray([runs[s]["final"] < STALL for s in seeds])
      rates = [float(np.mean(stalled(runs))) for runs in (summary[arm], base)]
      row += [f"{outcomes.paired_binary_p(stalled(summary[arm]), stalled(base)):.4f}",
              "—" if rates[0] == rates[1] else str(outcomes.seeds_for_power(*rates) or "> 200")]
    rows.append("| " + " | ".join(row) + " |")
  return rows


STALL_HEADER = ["| regime | G | arm | stalls | solves | p (McNemar, vs GRPO) | "
                "seeds for 80% power |", "|---|---|---|---|---|---|---|"]


OUTCOMES = (("stalled", lambda j: j < STALL), ("between", lambda j: STALL <= j < SOLVE),
            ("solved", lambda j: j >= SOLVE))


def key_table(curves: dict, summary: dict) -> list[str]:
  """What a stalled run is, from the policy's keys after its last update (filler-blind
  key_token: each run's "final_keys", ``[prompts, K, |C|]``): per arm and outcome (its
  final J below STALL, between, at least SOLVE), the runs, the mean entropy of the key
  distribution at each decisive position (nats; ln |C| is uniform), and the share of the
  (prompt, position) pairs whose right key has probability at least 1/2, whose wrong keys
  have (one of them; settled on a wrong key), and where no key has (undecided). A right
  key at position k is read given the right keys before it. Empty unless every run of the
  cell records its keys."""
  if not all("final_keys" in curve for runs in curves.values() for curve in runs.values()):
    return []
  first_run = next(iter(next(iter(curves.values())).values()))
  n_decisive = np.shape(first_run["final_keys"])[1]
  lines = ["The policy's keys after the last update, by outcome (final J below "
           f"{STALL}: stalled; at least {SOLVE}: solved): mean entropy of the key distribution "
           "at each decisive position k (nats), and the share of (prompt, k) pairs where the "
           "right key (given the right keys before it), a wrong key, or no key has "
           "probability at least 1/2.", "",
           "| arm | outcome | runs | " + " | ".join(f"key entropy k = {k + 1}"
                                                    for k in range(n_decisive))
           + " | right key | wrong key | undecided |",
           "|---|---|---|" + "---|" * (n_decisive + 3)]
  for arm, runs in curves.items():
    for outcome, holds in OUTCOMES:
      seeds = [s for s in runs if holds(summary[arm][s]["final"])]
      if not seeds:
        continue
      keys = np.stack([np.asarray(runs[s]["final_keys"], np.float64) for s in seeds])
      right = np.take_along_axis(keys, np.asarray(runs[seeds[0]]["key_targets"])[
          None, ..., None], -1)[..., 0]  # [runs, prompts, K]
      wrong = (keys.max(-1) >= 0.5) & (right < 0.5)
      entropy = scipy.stats.entropy(keys, axis=-1).mean(axis=(0, 1))
      lines.append(f"| {arm} | {outcome} | {len(seeds)} | "
                   + " | ".join(f"{e:.2f}" for e in entropy)
                   + f" | {np.mean(right >= 0.5):.2f} | {np.mean(wrong):.2f} | "
                   f"{np.mean((right < 0.5) & ~wrong):.2f} |")
  return lines


def oracle_speedup(summary: dict) -> float | None:
  """GRPO's tokens to 0.9 x the best plateau over the oracle's (medians over the seeds that
  reach it, `report.summarise`'s "tau"); None when either arm is missing or never reaches it."""
  taus = [[m["tau"] for m in summary.get(arm, {}).values() if m["tau"] is not None]
          for arm in ("grpo", "oracle")]
  if not all(taus) or np.median(taus[1]) <= 0:
    return None
  return float(np.median(taus[0]) / np.median(taus[1]))


def alignment_check(summaries: dict, curves: dict) -> list[str]:
  """What the mechanism predicts for the learning curves, checked: where GRPO's gradient at
  the start points further from the exact-credit gradient (a lower cosine), exact credit
  should reach the plateau sooner relative to GRPO. Per (regime, G) cell with gradient
  measurements: GRPO's cosine at the first measurement (mean over seeds) and the speed-up
  tau_grpo / tau_oracle (medians over the seeds reaching 0.9 x the best plateau); across the
  cells, Spearman's rank correlation of the two (predicted negative)."""
  lines = ["| regime | G | GRPO's gradient cosine to exact at the start | oracle's speed-up "
           "(GRPO's tokens to 0.9 × best ÷ the oracle's) |", "|---|---|---|---|"]
  pairs = []
  for regime, by_g in summaries.items():
    for g, summary in sorted(by_g.items()):
      grpo = curves[regime][g].get("grpo", {})
      if not {"grpo", "oracle"} <= set(summary) or not all(
          "cosine_to_exact" in run for run in grpo.values()):
        continue
      cosine = float(np.mean([run["cosine_to_exact"][0] for run in grpo.values()]))
      speedup = oracle_speedup(summary)
      lines.append(f"| {regime} | {g} | {cosine:.2f} | "
                   + ("—" if speedup is None else f"{speedup:.1f}×") + " |")
      if speedup is not None:
        pairs.append((cosine, speedup))
  if len(pairs) < 3:
    return lines + ["", f"(Spearman's ρ needs 3 cells where both arms reach the level; "
                        f"{len(pairs)} here.)"]
  rho, p = scipy.stats.spearmanr(*zip(*pairs))
  return lines + ["", f"Across the {len(pairs)} cells, Spearman's ρ of GRPO's starting cosine "
                      f"with the oracle's speed-up = {rho:+.2f} (p = {p:.3f}; the mechanism "
                      "predicts ρ < 0)."]


def localisation_figure(workdir: pathlib.Path, rows: list[dict], rng) -> list[str]:
  """localisation.png: Delta_loc on AUC per (regime, G) cell (mean over seeds, 95% bootstrap
  bars from 5 seeds) against each regressor of `_localisation_runs` every run has: log2 G,
  GRPO's effective noisy tokens, its filler share and its signal fraction."""
  plt = report._pyplot()
  if plt is None or not rows:
    return []
  names = [name for name in rows[0]["x"] if all(name in r["x"] for r in rows)]
  fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
  for regime in dict.fromkeys(r["regime"] for r in rows):
    cells = {}
    for r in rows:
      if r["regime"] == regime:
        cells.setdefault(r["g"], []).append(r)
    for ax, name in zip(axes[0], names):
      x = [np.mean([r["x"][name] for r in cell]) for cell in cells.values()]
      ci = [statistics.bootstrap_ci([r["delta"]["auc"] for r in cell], rng, 2000)
            for cell in cells.values()]
      mean = np.asarray([c[0] for c in ci])
      bars = np.asarray([[c[0] - c[1], c[2] - c[0]] if len(cell) >= statistics.MIN_SEEDS
                         else [0.0, 0.0] for c, cell in zip(ci, cells.values())]).T
      ax.errorbar(x, mean, yerr=bars, marker="o", capsize=3, label=regime)
  for ax, name in zip(axes[0], names):
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xlabel(name)
    ax.set_ylabel("Δ_loc on AUC (oracle − oracle_seq)")
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(workdir / "localisation.png", dpi=120)
  plt.close(fig)
  return ["![localisation gain against G and GRPO's gradient noise](localisation.png)", "",
          "What to see: if sequence-level credit suffices because its filler noise averages "
          "out (H1, H2), the gain from localising exact credit falls as G grows (first "
          "panel), as GRPO's credit and gradient carry less filler noise (noisy tokens, "
          "filler share) and as its gradient carries more consistent signal (signal "
          "fraction). Each point is a (regime, G) cell: the mean over seeds with its 95% "
          "bootstrap interval."]


def filler_entropy(by_g: dict) -> str:
  """The mean entropy of the policy on filler tokens in the first batch of each run."""
  first = [curve["filler_entropy"] for cell in by_g.values() for result in cell["arms"].values()
           for curve in result["curves"].values() if "filler_entropy" in curve]
  return (f"Filler entropy of the starting policy: {np.mean(first):.3f} nats (mean over runs; "
          f"ln |F| is uniform)." if first else "")


def budget_check(summary: dict, level: float, budget: int) -> str:
  """Whether the cell's budget Z gave GRPO room to plateau: Z over GRPO's median tokens to
  J = level (0.9 x the best arm's plateau) on the seeds that reach it; the protocol asks
  for at least 3."""
  reached = [m["tau"] for m in summary["grpo"].values() if m["tau"] is not None]
  if not reached:
    return f"Budget: GRPO did not reach J = {level:.3f} within Z = {budget:,} tokens."
  tau = float(np.median(reached))
  return (f"Budget: GRPO reaches J = {level:.3f} (0.9 × the best plateau) after {tau:,.0f} "
          f"tokens (median of the {len(reached)}/{len(summary['grpo'])} seeds that do): "
          f"Z = {budget / max(tau, 1.0):.1f} × that (the protocol asks ≥ 3).")


def mechanism_table(curves: dict) -> list[str]:
  """Each arm's gradient measurements (`diagnostics.mechanism`) at the measured checkpoints,
  means over seeds: cosine with the exact-credit gradient, signal fraction, and the filler
  share |g_filler| / (|g_filler| + |g_decisive|)."""
  runs = {arm: list(by_seed.values()) for arm, by_seed in curves.items()}
  if not all("cosine_to_exact" in run for by_arm in runs.values() for run in by_arm):
    return []
  first = runs[next(iter(runs))][0]
  tokens = first.get("mechanism_gen_tokens", first["gen_tokens"])  # (every evaluation)
  mean = lambda arm, f: np.mean([f(run) for run in runs[arm]], axis=0)
  cell = lambda values: " / ".join(f"{v:.2f}" for v in values)
  everywhere = lambda name: all(name in run for by_arm in runs.values() for run in by_arm)
  noisy_header = " effective noisy tokens (mean over updates) |" if everywhere(
      "noisy_tokens") else ""
  implicit_header = (" credit cosine to exact, raw | ... as the gradient sees it |"
                     if everywhere("implicit_credit_cosine") else "")
  at = " / ".join(f"{t / 1e3:,.0f}k" for t in tokens)
  lines = [f"Gradient measurements after {at} generated tokens (means over seeds; "
           "`lab.batched`): cosine of the arm's policy gradient with the exact-credit "
           "gradient on the same batch; signal fraction |mean g|² / mean |g|² over fresh "
           "batches; filler share of the gradient |g_filler| / (|g_filler| + |g_decisive|)"
           + ("; effective noisy tokens: the credit weight |A_t| / max |A| summed over a "
              "response's non-decisive tokens (broadcast: T − K; a batch without credit counts 0)"
              if noisy_header else "")
           + ("; the cosine over tokens of the arm's credit with the exact credit, raw and "
              "averaged over the responses of a group that share the token's state and take "
              "it (identical state-action pairs share one gradient term: GRPO's implicit "
              "process reward, arXiv 2509.21154)" if implicit_header else "") + ".",
           "",
           "| arm | cosine to exact | signal fraction | filler share |" + implicit_header
           + noisy_header,
           "|---|---|---|---|" + "---|" * (2 * bool(implicit_header) + bool(noisy_header))]
  for arm in runs:
    lines.append(f"| {arm} | {cell(mean(arm, lambda r: r['cosine_to_exact']))} | "
                 f"{cell(mean(arm, lambda r: r['signal_fraction']))} | "
                 f"{cell(mean(arm, filler_share))} |"
                 + (f" {cell(mean(arm, lambda r: r['credit_cosine']))} | "
                    f"{cell(mean(arm, lambda r: r['implicit_credit_cosine']))} |"
                    if implicit_header else "")
                 + (f" {mean(arm, lambda r: r['noisy_tokens']):.1f} |" if noisy_header else ""))
  return lines


def ranking_table(curves: dict) -> list[str]:
  """The critic's ranking of alternative steps (`diagnostics.ranking`) for the arms that trained
  a critic, at the measured checkpoints (means over seeds): top-1 agreement with the exact
  values for the critic, a random order and Monte-Carlo values of k continuations."""
  runs = {arm: list(by_seed.values()) for arm, by_seed in curves.items()
          if all("critic_top1" in run for run in by_seed.values())}
  if not runs:
    return []
  first = next(iter(runs.values()))[0]
  at = " / ".join(f"{t / 1e3:,.0f}k" for t in first["mechanism_gen_tokens"])
  columns = [name for name in diagnostics.RANKING if name in first]
  lines = [f"Ranking the alternative keys at each decisive position (top-1 agreement with the "
           f"exact values; means over seeds after {at} generated tokens): the critic trained "
           "beside the arm, a random order, and Monte-Carlo values of k continuations per "
           "alternative (ties broken at random).", "",
           "| arm | " + " | ".join(name.replace("_top1", "") for name in columns) + " |",
           "|---|" + "---|" * len(columns)]
  for arm, by_arm in runs.items():
    lines.append(f"| {arm} | " + " | ".join(
        " / ".join(f"{v:.2f}" for v in np.mean([run[name] for run in by_arm], axis=0))
        for name in columns) + " |")
  return lines


def busy_seconds(spans) -> float:
  """The length of the union of the (start, end) spans: the time during which at least one
  piece ran."""
  busy, reached = 0.0, -np.inf
  for start, end in sorted(spans):
    busy += max(0.0, end - max(start, reached))
    reached = max(reached, end)
  return busy
