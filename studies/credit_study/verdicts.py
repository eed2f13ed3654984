"""The credit study's evidence, hypothesis by hypothesis, from the cells of one or more
sweeps (`studies.credit_study.sweep` writes DIR/cells/<regime>/G<g>.json; a preset that adds
arms to the small preset's cells, or runs other regimes, has its own DIR):

  python -m studies.credit_study.verdicts studies/credit_study/results \\
      studies/credit_study/results/regimes studies/credit_study/results/budgets \\
      studies/credit_study/results/scale studies/credit_study/results/mid_filler \\
      studies/credit_study/results/same_rate --out studies/credit_study/results/verdicts

writes OUT/verdicts.md and OUT/differences.png.

The headline claims are pre-specified here (CLAIMS), each with the cells that feed it, and
each is one family for the correction: Holm across its cells (or regimes, for a slope). The
primary claims form a hierarchy (fixed-sequence gatekeeping): the first is tested at alpha;
each next one only if every test of the ones before it rejected "no difference", so the
family-wise error over the primary claims stays at alpha. A secondary claim is its own
family (not gated). Every other comparison in the cells is exploratory: one Holm family
across all of them. A comparison's verdict (`statistics.verdict`) is "higher" or "lower"
when significant and at least the margin, "negligible" when shown inside it, "ceiling"
when both arms' final J is at least CEILING, else "inconclusive"; it never depends on how
many arms a cell holds.

Per (regime, G) cell, paired by seed:

  H3, plateau   oracle - GRPO on final J (the mean of the exact measurements over the
                last 10% of the updates: the last 3 of 20 evenly spaced)
  H3, speed     oracle - GRPO on AUC over log10 generated tokens, and GRPO's and the
                oracle's time to 0.9 x the best plateau in tokens and in updates
                (Kaplan-Meier medians, a run that never reaches it censored at its budget)
  H1            GRPO's final J; oracle_seq - GRPO (the exact baseline, broadcast); GRPO's
                gradient at the start: cosine with the exact-credit gradient and its filler
                share |g_filler| / (|g_filler| + |g_decisive|)
  H2            the slopes on log2 G, per regime, of oracle - GRPO (final J, AUC) and of
                Delta_loc = oracle - oracle_seq (OLS over runs, bootstrap interval,
                permutation p)

Intervals are BCa bootstrap intervals (n/a below 5 seeds). The figure shows every arm's
difference from GRPO in every cell on one colour scale; a difference whose 95% interval holds
0 (or with fewer than 5 seeds) is hatched.
"""

import argparse
import collections
import dataclasses
import json
import pathlib
import re
import zlib

import numpy as np
import scipy.stats

from jaxcredit.lab import statistics
from studies.credit_study import report, tables

MARGIN = 0.05  # TOST margin on J, as the study's presets set it
METRICS = {"auc": "AUC over log₁₀ tokens", "final": "final J"}
T24 = ("uniform_filler", "peaked_filler", "mid_filler")  # key_token, T = 24, from chance
GS = (4, 8, 16, 32)


@dataclasses.dataclass(frozen=True)
class Claim:
  """A headline claim and the tests that feed it: `arm` - `base` (GRPO) on `metric` in
  each of `cells` ((regime, G) pairs), or with `slope`, the OLS slope of that difference on
  log2 G in each regime of `cells` (its G ignored)."""
  name: str
  arm: str
  metric: str
  cells: tuple
  primary: bool = False
  slope: bool = False
  base: str = "grpo"


CLAIMS = (
    Claim("H3, speed: exact credit learns faster at the primary cells (G = 8, 20 seeds)",
          "oracle", "auc", (("uniform_filler", 8), ("peaked_filler", 8)), primary=True),
    Claim("H2: exact credit's speed gain changes with G (slope on log₂ G)", "oracle", "auc",
          tuple((r, None) for r in T24), primary=True, slope=True),
    Claim("H3, speed at every G (T = 24 from chance)", "oracle", "auc",
          tuple((r, g) for r in T24 for g in GS)),
    Claim("H3, plateau at every G (T = 24 from chance)", "oracle", "final",
          tuple((r, g) for r in T24 for g in GS)),
    Claim("H1: the exact baseline broadcast (oracle_seq) against GRPO's plateau", "oracle_seq",
          "final", tuple((r, g) for r in T24 for g in GS)),
    Claim("Middling filler at three times the budget: the exact baseline's plateau "
          "(oracle_seq)", "oracle_seq", "final", (("mid_filler_Z3", 8),)),
    Claim("Middling filler at three times the budget: exact credit's plateau", "oracle",
          "final", (("mid_filler_Z3", 8),)),
    Claim("A warm start (J = 0.3): exact credit's speed", "oracle", "auc",
          tuple(("start_at_0_3", g) for g in GS)),
    # The same-rate controls (the same_rate preset): each contrast at one learning rate.
    Claim("Middling filler, three times the budget, both at 1e-3: the exact baseline's "
          "plateau against GRPO's", "oracle_seq", "final", (("mid_filler_Z3", 8),),
          base="grpo_at_1e-3"),
    Claim("Middling filler, three times the budget, both at 3e-3: the exact baseline's "
          "plateau against GRPO's", "oracle_seq_at_3e-3", "final", (("mid_filler_Z3", 8),)),
    Claim("Middling filler, three times the budget: GRPO at 1e-3 against its tuned 3e-3",
          "grpo_at_1e-3", "final", (("mid_filler_Z3", 8),)),
)


def read_cells(workdirs) -> dict:
  """{regime: {G: {arm: {seed: curve}}}} from each workdir's cells; a regime held by two
  workdirs is refused (its arms would mix runs of different settings)."""
  cells, source = {}, {}
  for workdir in map(pathlib.Path, workdirs):
    paths = sorted((workdir / "cells").glob("*/G*.json"))
    if not paths:
      raise ValueError(f"{workdir} holds no cells (expected {workdir}/cells/<regime>/G<g>.json).")
    for path in paths:
      regime, g = path.parent.name, int(path.stem[1:])
      if source.setdefault(regime, workdir) != workdir:
        raise ValueError(f"Regime {regime!r} is in both {source[regime]} and {workdir}.")
      arms = json.loads(path.read_text())["arms"]
      cells.setdefault(regime, {})[g] = {
          arm: {int(s): c for s, c in r["curves"].items()} for arm, r in arms.items()}
  return {regime: dict(sorted(by_g.items())) for regime, by_g in cells.items()}


def cell_evidence(curves: dict, rng) -> dict:
  """One cell's summary (`report.summarise`), every arm's paired comparison with GRPO on
  each of METRICS before any correction (`tables.paired`; `correct` decides them), GRPO's
  and the oracle's Kaplan-Meier time to 0.9 x the best plateau in tokens and updates
  (`tables.time_to_level`) and GRPO's gradient at the start."""
  summary, bounds = report.summarise(curves, final_share=tables.FINAL_SHARE)
  out = {"summary": summary, "level": bounds["level"],
         **{m: tables.paired(summary, m, MARGIN, rng) for m in METRICS}}
  out["time_to_level"] = {arm: tables.time_to_level(summary[arm])
                          for arm in ("grpo", "oracle") if arm in summary}
  grpo = list(curves["grpo"].values())
  if all("cosine_to_exact" in run for run in grpo):
    out["cosine"] = float(np.mean([run["cosine_to_exact"][0] for run in grpo]))
    out["filler_share"] = float(np.mean([tables.filler_share(run)[0] for run in grpo]))
  if {"oracle", "oracle_seq"} <= set(summary):
    seeds = sorted(set(summary["oracle"]) & set(summary["oracle_seq"]))
    out["loc"] = np.asarray([summary["oracle"][s]["final"] - summary["oracle_seq"][s]["final"]
                             for s in seeds])
  return out


def stream(*names) -> np.random.Generator:
  """The bootstrap draws of one comparison, seeded by its names (regime, G, quantity): a
  number does not move when other regimes, workdirs or quantities are added."""
  return np.random.default_rng(zlib.crc32("/".join(map(str, names)).encode()))


def _interval(values, rng) -> str:
  return report.fmt_interval(*statistics.reported_ci(values, rng, 10000))


def _delta(evidence: dict, arm: str, metric: str) -> str:
  c = evidence[metric].get(arm)
  return "—" if c is None else f"{report.fmt_interval(*c['delta'])}, {c['verdict']}"


def _time(km: dict, unit: str) -> str:
  """A Kaplan-Meier median with the share of runs that reached the level; beyond every
  run's budget when fewer than half did."""
  median = km["median"]
  text = ("> budget" if median is None else f"{median / 1000:.0f}k" if unit == "tokens"
          else f"{median:.0f}")
  return text + ("" if km["reached"] == 1 else f" ({km['reached']:.0%} reach)")


def _speed(times: dict, unit: str) -> str:
  """GRPO's and the oracle's Kaplan-Meier medians in `unit`, and their ratio."""
  if not {"grpo", "oracle"} <= set(times):
    return "—"
  grpo, oracle = times["grpo"][unit], times["oracle"][unit]
  ratio = ("" if None in (grpo["median"], oracle["median"]) or oracle["median"] <= 0
           else f" ({grpo['median'] / oracle['median']:.1f}×)")
  return f"{_time(grpo, unit)} → {_time(oracle, unit)}{ratio}"


def cell_table(evidence: dict) -> list[str]:
  """One row per (regime, G): the numbers each hypothesis is read from."""
  lines = ["| regime | G | GRPO final J (IQM) | oracle − GRPO, final J | oracle − GRPO, AUC | "
           "τ GRPO → τ oracle, tokens | τ, updates | oracle_seq − GRPO, final J | "
           "Δ_loc, final J | GRPO at the start: cosine to exact / filler share |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for regime, by_g in evidence.items():
    for g, e in by_g.items():
      finals = [m["final"] for m in e["summary"]["grpo"].values()]
      start = (f"{e['cosine']:.2f} / {e['filler_share']:.2f}" if "cosine" in e else "—")
      lines.append(
          f"| {regime} | {g} | {np.mean(finals):.3f} ({scipy.stats.trim_mean(finals, 0.25):.3f}) | "
          f"{_delta(e, 'oracle', 'final')} | {_delta(e, 'oracle', 'auc')} | "
          + _speed(e.get("time_to_level", {}), "tokens") + " | "
          + _speed(e.get("time_to_level", {}), "updates") + " | "
          f"{_delta(e, 'oracle_seq', 'final')} | "
          + (_interval(e["loc"], stream(regime, g, "loc")) if "loc" in e else "—")
          + f" | {start} |")
  return lines


def _slope_data(by_g: dict, arm: str, base: str, metric: str) -> tuple[list, list]:
  """(log2 G, arm - base on `metric`) over every seed both arms ran, in every cell."""
  x, y = [], []
  for g, e in by_g.items():
    s = e["summary"]
    if {arm, base} <= set(s):
      for seed in sorted(set(s[arm]) & set(s[base])):
        x.append(np.log2(g))
        y.append(s[arm][seed][metric] - s[base][seed][metric])
  return x, y


def slope_test(by_g: dict, arm: str, base: str, metric: str, rng) -> dict | None:
  """{"delta": (slope, low, high), "p", "x", "y"} of arm - base on log2 G; None with fewer
  than two G."""
  x, y = _slope_data(by_g, arm, base, metric)
  if len(set(x)) < 2:
    return None
  return {"delta": statistics.ols_slope(x, y, rng), "p": statistics.slope_p(x, y, rng),
          "x": x, "y": y}


def scale_slopes(evidence: dict) -> list[str]:
  """H2: per regime with at least two G, the OLS slope on log2 G (over runs, paired by
  seed) of oracle - GRPO and of Delta_loc, on final J and AUC; H2 predicts slopes < 0.
  The p-values are uncorrected (the corrected ones of the claims are `claims_table`'s)."""
  lines = ["| regime | quantity | slope on log₂ G [95% CI] | p (permutation) | at the largest G |",
           "|---|---|---|---|---|"]
  for regime, by_g in evidence.items():
    for quantity, (arm, base) in {"oracle − GRPO": ("oracle", "grpo"),
                                  "Δ_loc = oracle − oracle_seq": ("oracle", "oracle_seq")}.items():
      for metric in METRICS:
        rng = stream(regime, quantity, metric)
        test = slope_test(by_g, arm, base, metric, rng)
        if test is None:
          continue
        x, y = np.asarray(test["x"]), np.asarray(test["y"])
        slope, low, high = test["delta"]
        lines.append(f"| {regime} | {quantity}, {METRICS[metric]} | {slope:+.3f} "
                     f"[{low:+.3f}, {high:+.3f}] | {test['p']:.4f} | "
                     f"{_interval(y[x == x.max()], rng)} |")
  return lines


def _claim_tests(claim: Claim, evidence: dict) -> list[tuple[str, dict, tuple | None]]:
  """(where, test, key) of every test that feeds `claim` among the cells read: a copy of
  each cell comparison (a comparison can feed more than one claim) with its key (regime, G,
  metric, arm) in `evidence`, or None for a test no cell comparison holds (a slope, or a
  pair without GRPO)."""
  tests = []
  for regime, g in claim.cells:
    if claim.slope:
      if regime in evidence:
        test = slope_test(evidence[regime], claim.arm, "grpo", claim.metric,
                          stream(regime, claim.arm, claim.metric, "slope"))
        if test is not None:
          tests.append((regime, {**test, "p_tost": 1.0, "at_ceiling": False}, None))
    elif claim.base != "grpo":
      summary = evidence.get(regime, {}).get(g, {}).get("summary", {})
      if {claim.arm, claim.base} <= set(summary):
        pair = {name: summary[name] for name in (claim.base, claim.arm)}
        tests.append((f"{regime}, G = {g}", tables.paired(
            pair, claim.metric, MARGIN, stream(regime, g, claim.arm, claim.base),
            base=claim.base)[claim.arm], None))
    else:
      c = evidence.get(regime, {}).get(g, {}).get(claim.metric, {}).get(claim.arm)
      if c is not None:
        tests.append((f"{regime}, G = {g}", dict(c), (regime, g, claim.metric, claim.arm)))
  return tests


def correct(evidence: dict) -> list[tuple[Claim, list[tuple[str, dict]]]]:
  """Decides every comparison: the tests of each claim of CLAIMS as one Holm family (the
  primary ones gated in order), then every comparison no claim holds as one exploratory
  family. Writes "verdict" and "family" into each cell comparison of `evidence` (the first
  claim holding it, else "exploratory"); returns each claim read with its decided tests."""
  claimed, decided, gate = set(), [], True
  for claim in CLAIMS:
    tests = _claim_tests(claim, evidence)
    if not tests:
      continue
    family = [test for _, test, _ in tests]
    tables.decide(family, 0.0 if claim.slope else MARGIN)
    if claim.primary and not gate:
      for test in family:
        test["verdict"] = "not tested (an earlier primary claim did not hold)"
    if claim.primary:
      gate = gate and all(t["p_holm"] <= tables.VERDICT_ALPHA for t in family)
    if claim.slope:
      for test in family:
        test["verdict"] = {"higher": "rises with G", "lower": "falls with G"}.get(
            test["verdict"], test["verdict"])
    for _, test, key in tests:
      if key is not None and key not in claimed:
        claimed.add(key)
        regime, g, metric, arm = key
        evidence[regime][g][metric][arm].update(verdict=test["verdict"], p_holm=test["p_holm"],
                                                family=claim.name)
    decided.append((claim, [(where, test) for where, test, _ in tests]))
  exploratory = [c for regime, by_g in evidence.items() for g, e in by_g.items()
                 for metric in METRICS for arm, c in e[metric].items()
                 if (regime, g, metric, arm) not in claimed]
  tables.decide(exploratory, MARGIN)
  for c in exploratory:
    c["family"] = "exploratory"
  return decided


def _p(p: float) -> str:
  return "< 0.0001" if p < 1e-4 else f"{p:.4f}"


def claims_table(decided) -> list[str]:
  """One row per test of each claim: its place, the difference (or slope) with its
  interval, its p before and after the claim's Holm correction, and its verdict."""
  lines = ["| claim | cell | difference [95% CI] | p | p (Holm, the claim's family) | "
           "verdict |", "|---|---|---|---|---|---|"]
  for claim, tests in decided:
    name = (f"**{claim.name}**" + (" (primary)" if claim.primary else "")
            + ("" if claim.base == "grpo" else f" ({claim.arm} − {claim.base})"))
    for where, t in tests:
      lines.append(f"| {name} | {where} | {report.fmt_interval(*t['delta'])} | {_p(t['p'])} | "
                   f"{_p(t['p_holm'])} | {t['verdict']} |")
      name = ""
  return lines


def exploratory_table(evidence: dict) -> list[str]:
  """Every comparison no claim holds, decided in one Holm family across all of them."""
  lines = ["| regime | G | arm − GRPO | difference [95% CI] | p | p (Holm, exploratory) | "
           "verdict |", "|---|---|---|---|---|---|---|"]
  for regime, by_g in evidence.items():
    for g, e in by_g.items():
      for metric, label in METRICS.items():
        for arm in _ordered(e[metric]):
          c = e[metric][arm]
          if c["family"] == "exploratory":
            lines.append(f"| {regime} | {g} | {arm}, {label} | {report.fmt_interval(*c['delta'])} "
                         f"| {_p(c['p'])} | {_p(c['p_holm'])} | {c['verdict']} |")
  return lines


def _ordered(arms) -> list[str]:
  """The arms in order of first appearance, a numbered family (oracle_mc_K) by its number."""
  arms = list(dict.fromkeys(arms))
  stem = lambda arm: re.sub(r"\d+$", "", arm)
  first = {s: i for i, s in reversed(list(enumerate(map(stem, arms))))}
  number = lambda arm: int(arm[len(stem(arm)):] or -1)
  return sorted(arms, key=lambda arm: (first[stem(arm)], number(arm)))


def differences_figure(out: pathlib.Path, evidence: dict) -> list[str]:
  """differences.png: every arm's mean paired difference from GRPO per cell (rows) on
  each of METRICS (panels), one diverging colour scale per panel with its colour bar;
  hatched where the 95% interval holds 0 or is n/a."""
  plt = report._pyplot()
  if plt is None:
    return ["(figure skipped: matplotlib is not installed; `pip install jaxcredit[plot]`)"]
  rows = [(regime, g) for regime, by_g in evidence.items() for g in by_g]
  arms = _ordered(a for r, g in rows for a in evidence[r][g]["auc"])
  fig, axes = plt.subplots(len(METRICS), 1, figsize=(0.9 * len(arms) + 5,
                                                     len(METRICS) * (0.4 * len(rows) + 2)),
                           squeeze=False)
  for ax, (metric, label) in zip(axes[:, 0], METRICS.items()):
    value = np.full((len(rows), len(arms)), np.nan)
    masked = np.zeros_like(value, bool)
    for i, (regime, g) in enumerate(rows):
      for j, arm in enumerate(arms):
        c = evidence[regime][g][metric].get(arm)
        if c is not None:
          mean, low, high = c["delta"]
          value[i, j], masked[i, j] = mean, low is None or low <= 0.0 <= high
    scale = float(np.nanmax(np.abs(value))) or 1.0
    image = ax.imshow(value, cmap="RdBu", vmin=-scale, vmax=scale, aspect="auto")
    for i, j in zip(*np.nonzero(~np.isnan(value))):
      if masked[i, j]:
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///",
                                   edgecolor="grey", lw=0))
      ax.text(j, i, f"{value[i, j]:+.2f}", ha="center", va="center", fontsize=7,
              color="dimgrey" if masked[i, j] else "black")
    ax.set_xticks(range(len(arms)), arms, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), [f"{r}, G = {g}" for r, g in rows], fontsize=8)
    ax.set_title(f"{label}: arm − GRPO (paired by seed)", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04, label=f"mean difference in {label}")
  fig.tight_layout()
  fig.savefig(out / "differences.png", dpi=120)
  plt.close(fig)
  return ["![every arm's difference from GRPO, per cell](differences.png)", "",
          "What to see: blue cells beat GRPO, red ones fall behind it; hatched cells are not "
          "distinguishable from 0 (their 95% interval holds it, or it has fewer than 5 "
          "seeds); blank cells did not run that arm. AUC measures speed (over log tokens), "
          "final J the plateau."]


def write(workdirs, out) -> dict:
  """Reads the cells of `workdirs`, writes OUT/verdicts.md and OUT/differences.png;
  returns {regime: {G: cell_evidence}}."""
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  cells = read_cells(workdirs)
  evidence = {regime: {g: cell_evidence(curves, stream(regime, g)) for g, curves in by_g.items()
                       if "grpo" in curves} for regime, by_g in cells.items()}
  decided = correct(evidence)
  arms = collections.Counter(a for by_g in cells.values() for c in by_g.values() for a in c)
  lines = ["# The credit study's evidence, by hypothesis", "",
           f"Read from the cells of {', '.join(f'`{w}`' for w in workdirs)} by `python -m "
           "studies.credit_study.verdicts`: " + ", ".join(
               f"{len(by_g)} cell{'s' * (len(by_g) != 1)} of `{r}`" for r, by_g in cells.items())
           + "; arms (cells holding them): " + ", ".join(f"{a} ({n})" for a, n in arms.items())
           + ". Differences are paired by seed, with 95% BCa bootstrap intervals (n/a below 5 "
           "seeds), sign-flip p-values and sign-flip TOST at "
           f"±{MARGIN}; verdicts at α = {tables.VERDICT_ALPHA} after Holm within each "
           "pre-specified claim (below) or, for a comparison no claim holds, across all of "
           "them (exploratory). higher / lower: significant and at least the margin; "
           "negligible: shown inside the margin; ceiling: both arms' mean final J at least "
           f"{tables.CEILING}; inconclusive: neither.", "",
           "## The claims, corrected", "",
           "Pre-specified in `studies.credit_study.verdicts.CLAIMS`. The primary claims are "
           "tested in order, each only if every test of the ones before it held (fixed-"
           "sequence gatekeeping); each other claim is a Holm family of its own.", "",
           *claims_table(decided), "",
           "## Per cell", "", *cell_table(evidence), "",
           "## Across G (H2)", "",
           "H2 (scale compensates) predicts negative slopes and differences near 0 at the "
           "largest G; H3 (capability left on the table) needs a plateau gap (final J) that "
           "persists there.", "", *scale_slopes(evidence), "",
           "## Stalls", "",
           f"A run stalls when its final J is below {tables.STALL} and solves when it is at "
           f"least {tables.SOLVE}. Stalls are paired by seed against GRPO's (exact McNemar "
           "p, uncorrected). The last column is the seeds per arm at which Fisher's exact test "
           "would tell the two stall rates apart with 80% power, were they the true ones.", "",
           *tables.STALL_HEADER,
           *(row for regime, by_g in evidence.items() for g, e in by_g.items()
             for row in tables.stall_rows(regime, g, e["summary"])), "",
           "## GRPO's implicit process reward", "",
           "Identical state-action pairs within a group share one gradient term, so the "
           "gradient sees each token's credit averaged over the group's responses that share "
           "its state and take it (arXiv 2509.21154). The cosine of GRPO's credit with the "
           "exact credit over a batch's tokens, raw and as the gradient sees it, at the "
           "first two gradient measurements (tokens generated before them), and the gain "
           "paired by seed. Filler hidden from the policy makes states the decisive keys "
           "alone, so responses share them by construction; with visible filler "
           "(`visible_filler_T8`) a state is the whole prefix.", "",
           *tables.IMPLICIT_HEADER,
           *(row for regime, by_g in cells.items() for g, curves in by_g.items()
             if "grpo" in curves
             for row in tables.implicit_credit_rows(regime, g, curves["grpo"],
                                                    stream(regime, g, "implicit"))), "",
           "## Every arm against GRPO", "", *differences_figure(out, evidence), "",
           "## Exploratory comparisons", "",
           "Every comparison that no claim holds, corrected together (one Holm family).", "",
           *exploratory_table(evidence)]
  (out / "verdicts.md").write_text("\n".join(lines) + "\n")
  return evidence


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("workdirs", nargs="+", help="sweep working directories (with cells/)")
  parser.add_argument("--out", required=True, help="where verdicts.md and the figure go")
  args = parser.parse_args(argv)
  write(args.workdirs, args.out)
  print(f"[verdicts] wrote {pathlib.Path(args.out) / 'verdicts.md'}", flush=True)


if __name__ == "__main__":
  main()
