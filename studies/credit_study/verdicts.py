"""The credit study's evidence, hypothesis by hypothesis, from the cells of one or more
sweeps (`studies.credit_study.sweep` writes DIR/cells/<regime>/G<g>.json; a preset that adds
arms to the small preset's cells, or runs other regimes, has its own DIR):

  python -m studies.credit_study.verdicts studies/credit_study/results \\
      studies/credit_study/results/regimes studies/credit_study/results/budgets \\
      studies/credit_study/results/scale studies/credit_study/results/mid_filler \\
      studies/credit_study/results/mid_filler_Z3 --out studies/credit_study/results/verdicts

writes OUT/verdicts.md and OUT/differences.png. Per (regime, G) cell, paired by seed:

  H3, plateau   oracle - GRPO on final J (the mean of the last 3 exact measurements)
  H3, speed     oracle - GRPO on AUC over log10 generated tokens, and GRPO's tokens to
                0.9 x the best plateau over the oracle's (medians over the seeds that reach it)
  H1            GRPO's final J and its plateau verdict; oracle_seq - GRPO (the exact
                baseline, broadcast); GRPO's gradient at the start: cosine with the exact-
                credit gradient and its filler share |g_filler| / (|g_filler| + |g_decisive|)
  H2            the slopes on log2 G, per regime, of oracle - GRPO (final J, AUC) and of
                Delta_loc = oracle - oracle_seq (OLS over runs, bootstrap interval)

Verdicts as in the sweep's reports (`tables.compare`), with Holm's correction across
every arm the cell holds (the G = 8 cells hold the added arms too, so their family is larger than
in the small report). The figure shows every arm's difference from GRPO in every cell on one
colour scale; a difference whose 95% interval holds 0 (or with fewer than 5 seeds) is hatched.
"""

import argparse
import collections
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
  """One cell's summary (`report.summarise`), every arm's comparison with GRPO on each of
  METRICS (`tables.compare`), the oracle's speed-up and GRPO's gradient at the start."""
  summary, bounds = report.summarise(curves)
  out = {"summary": summary, "level": bounds["level"],
         **{m: tables.compare(summary, m, MARGIN, rng) for m in METRICS}}
  out["speedup"] = tables.oracle_speedup(summary)
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


def cell_table(evidence: dict) -> list[str]:
  """One row per (regime, G): the numbers each hypothesis is read from."""
  lines = ["| regime | G | GRPO final J (IQM) | oracle − GRPO, final J | oracle − GRPO, AUC | "
           "τ GRPO ÷ τ oracle | oracle_seq − GRPO, final J | Δ_loc, final J | "
           "GRPO at the start: cosine to exact / filler share |",
           "|---|---|---|---|---|---|---|---|---|"]
  for regime, by_g in evidence.items():
    for g, e in by_g.items():
      finals = [m["final"] for m in e["summary"]["grpo"].values()]
      start = (f"{e['cosine']:.2f} / {e['filler_share']:.2f}" if "cosine" in e else "—")
      lines.append(
          f"| {regime} | {g} | {np.mean(finals):.3f} ({scipy.stats.trim_mean(finals, 0.25):.3f}) | "
          f"{_delta(e, 'oracle', 'final')} | {_delta(e, 'oracle', 'auc')} | "
          + (f"{e['speedup']:.1f}×" if e["speedup"] else "—") + " | "
          f"{_delta(e, 'oracle_seq', 'final')} | "
          + (_interval(e["loc"], stream(regime, g, "loc")) if "loc" in e else "—")
          + f" | {start} |")
  return lines


def scale_slopes(evidence: dict) -> list[str]:
  """H2: per regime with at least two G, the OLS slope on log2 G (over runs, paired by
  seed) of oracle - GRPO and of Delta_loc, on final J and AUC; H2 predicts slopes < 0."""
  lines = ["| regime | quantity | slope on log₂ G [95% CI] | at the largest G |",
           "|---|---|---|---|"]
  for regime, by_g in evidence.items():
    if len(by_g) < 2:
      continue
    for quantity, (arm, base) in {"oracle − GRPO": ("oracle", "grpo"),
                                  "Δ_loc = oracle − oracle_seq": ("oracle", "oracle_seq")}.items():
      for metric in METRICS:
        x, y = [], []
        for g, e in by_g.items():
          s = e["summary"]
          if not {arm, base} <= set(s):
            continue
          for seed in sorted(set(s[arm]) & set(s[base])):
            x.append(np.log2(g))
            y.append(s[arm][seed][metric] - s[base][seed][metric])
        if len(set(x)) < 2:
          continue
        rng = stream(regime, quantity, metric)
        slope, low, high = statistics.ols_slope(x, y, rng)
        last = np.asarray(y)[np.asarray(x) == max(x)]
        lines.append(f"| {regime} | {quantity}, {METRICS[metric]} | {slope:+.3f} "
                     f"[{low:+.3f}, {high:+.3f}] | {_interval(last, rng)} |")
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
  arms = collections.Counter(a for by_g in cells.values() for c in by_g.values() for a in c)
  lines = ["# The credit study's evidence, by hypothesis", "",
           f"Read from the cells of {', '.join(f'`{w}`' for w in workdirs)} by `python -m "
           "studies.credit_study.verdicts`: " + ", ".join(
               f"{len(by_g)} cell{'s' * (len(by_g) != 1)} of `{r}`" for r, by_g in cells.items())
           + "; arms (cells holding them): " + ", ".join(f"{a} ({n})" for a, n in arms.items())
           + ". Differences are paired by seed, with 95% bootstrap intervals (n/a below 5 "
           "seeds) and verdicts after Holm across the arms each cell holds (TOST at "
           f"±{MARGIN} for equivalence).", "",
           "## Per cell", "", *cell_table(evidence), "",
           "## Across G (H2)", "",
           "H2 (scale compensates) predicts negative slopes and differences near 0 at the "
           "largest G; H3 (capability left on the table) needs a plateau gap (final J) that "
           "persists there.", "", *scale_slopes(evidence), "",
           "## Every arm against GRPO", "", *differences_figure(out, evidence)]
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
