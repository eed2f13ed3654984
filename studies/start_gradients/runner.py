"""GRPO's policy gradient at the start of training, split into its decisive-token and filler
parts, across response length T, samples per prompt G and filler entropy.

  python -m studies.start_gradients --config studies/start_gradients/configs.py:t_axis \
      --workdir DIR

For each (regime, G) of a credit-study config (its `run_regimes`, key_token regimes; every
regime when unset) and each seed: the starting policy (after the regime's SFT) and the
sweep's gradient measurements at evaluation 0 (`batched.make_run`'s mechanism, GRPO's arm,
over `mechanism_batches` fresh batches). Nothing is trained, so cells whose training needs
an accelerator (T = 96 and 384) are measured on a CPU. GRPO's gradient splits exactly as
g = g_decisive + g_filler (it is linear in the advantages). Each finished (regime, G) is
written once to DIR/cells/<regime>/G<g>.json (atomically) and skipped on a rerun (one
written under other settings is refused, not overwritten); with
`--config.report_only=True` nothing is measured and the report names the cells not yet
measured.

What H1's mechanism predicts, independently of this code. On filler-blind key_token the
reward does not read the filler, and later inputs do not show it, so a filler token's
score s_t = grad log pi(y_t | state) has mean zero given everything the advantage and the
other tokens' scores depend on: the filler scores are uncorrelated with one another and
with the advantages (martingale differences). Over N responses with advantages A_i,
  E|g_filler|^2 = (1 / N^2) sum_i E[A_i^2] sum_(t filler) E|s_it|^2,
which grows with the T - K filler tokens, while g_decisive sums the K decisive tokens'
terms whatever T is. At a fixed per-token score power the ratio
|g_filler| / |g_decisive| then grows as sqrt(T - K): slope 1/2 of log ratio on log (T - K).
The report fits that slope per filler regime and G (OLS over runs, bootstrap interval).
"""

import dataclasses
import json
import pathlib
import re
import time

import numpy as np

from jaxcredit.atomic import write_atomically
from jaxcredit.lab import batched, cells, statistics
from jaxcredit.tasks import key_token
from studies.credit_study import report, sweep

MEASURED = ("decisive_norm", "filler_norm", "cosine_to_exact", "signal_fraction")
GRPO = {"scale": "rms", "of": "grpo"}  # the sweep's GRPO arm
PREDICTED_SLOPE = 0.5


def start_cell(study, regime: str, group_size: int) -> cells.Cell:
  """The (regime, G) cell of `sweep.cell_of` with GRPO's arm alone, one update (a cell has
  at least one) and the gradient measurements at evaluation 0 only."""
  cell = sweep.cell_of(study, regime, group_size)
  if not isinstance(cell.task, key_token.KeyTokenConfig):
    raise ValueError(f"Regime {regime!r} is not key_token: the gradient's decisive and "
                     "filler parts are defined by key_token's decisive positions.")
  if not study.get("mechanism_batches"):
    raise ValueError("The study sets no mechanism_batches (fresh batches per measurement).")
  return dataclasses.replace(cell, arms=(GRPO,), prm_learning_rates=None, updates=1,
                             eval_every=1, mechanism_evals=(0,))


def measure(study, regime: str, group_size: int) -> dict:
  """{name: [seeds] for MEASURED, "filler_entropy": [seeds] (the starting policy's mean
  filler entropy, nats, on the first batch), "seconds"} of (regime, G), in programs of
  `runs_per_program` seeds (`sweep.train_in_programs`)."""
  runner = batched.Runner(start_cell(study, regime, group_size))
  result = sweep.train_in_programs(  # the rate is unused before the update
      study, runner, [(0, 1e-3, seed) for seed in study.seeds])
  return {**{name: result[name][:, 0].tolist() for name in (*MEASURED, "filler_entropy")},
          "seconds": result["compile_seconds"] + result["run_seconds"]}


def family(regime: str) -> str:
  """The regime without its length suffix (`peaked_filler_T96` -> `peaked_filler`)."""
  return re.sub(r"_T\d+$", "", regime)


def run(study, workdir: str) -> dict:
  """Measures every (regime, G) not yet written (none with `study.report_only`), then writes
  report.md (and ratio.png); returns {regime: {G: measurements}}."""
  workdir = pathlib.Path(workdir)
  (workdir / "cells").mkdir(parents=True, exist_ok=True)
  (workdir / "study_config.json").write_text(study.to_json_best_effort(indent=2))
  results, missing = {}, []
  for regime in sweep.regimes_to_run(study):
    for g in study.group_sizes:
      path = workdir / "cells" / regime / f"G{g}.json"
      expected = sweep.signature(start_cell(study, regime, g), list(study.seeds))
      if path.exists():
        stored = json.loads(path.read_text())
        sweep.refuse_other_settings(path, stored.get("signature"), expected)
      elif study.get("report_only"):
        missing.append(f"{regime} G = {g}")
        continue
      else:
        print(f"[start gradients] {regime} G={g}: {len(study.seeds)} seeds", flush=True)
        stored = {"signature": expected, **measure(study, regime, g)}
        path.parent.mkdir(exist_ok=True)
        write_atomically(path, lambda tmp: tmp.write_text(json.dumps(stored)))
      results.setdefault(regime, {})[g] = stored
  (workdir / "report.md").write_text(write_report(study, workdir, results, missing))
  print(f"[start gradients] wrote {workdir / 'report.md'}", flush=True)
  return results


def filler_tokens(study, regime: str) -> int:
  """T - K: the filler tokens of a response."""
  task = study.regimes[regime].task
  return task.length - task.n_decisive


def _ratio(cell: dict) -> np.ndarray:
  """|g_filler| / |g_decisive| per seed; NaN for a seed without gradient (every group of
  every batch with equal rewards gives GRPO none), which the tables and slopes leave out."""
  decisive = np.asarray(cell["decisive_norm"], float)
  return np.where(decisive > 0, np.asarray(cell["filler_norm"]) / np.where(
      decisive > 0, decisive, 1.0), np.nan)


def slopes(study, results: dict, rng) -> dict:
  """{(family, G): (slope, low, high)} of log |g_filler| / |g_decisive| on log (T - K), OLS
  over the runs of the family's regimes at that G (bootstrap interval), where the family
  has two lengths or more."""
  out = {}
  groups = {}
  for regime, by_g in results.items():
    for g, cell in by_g.items():
      groups.setdefault((family(regime), g), []).append((filler_tokens(study, regime), cell))
  for key, measured in groups.items():
    if len({n for n, _ in measured}) < 2:
      continue
    x = np.concatenate([np.full(len(c["filler_norm"]), np.log(n)) for n, c in measured])
    with np.errstate(divide="ignore"):
      y = np.concatenate([np.log(_ratio(c)) for _, c in measured])
    kept = np.isfinite(y)  # a zero filler part (log 0) cannot be fitted on a log scale
    out[key] = statistics.ols_slope(x[kept], y[kept], rng)
  return out


def write_report(study, workdir: pathlib.Path, results: dict, missing=()) -> str:
  """The measurements per (regime, G) with bootstrap intervals over seeds, the slopes on
  log (T - K) against the prediction, the figure, and the cells `missing` (not measured)."""
  rng = np.random.default_rng(0)
  def ci(values) -> str:  # over the seeds that define the value
    values = np.asarray(values, float)
    values = values[np.isfinite(values)]
    return report.fmt_interval(*statistics.reported_ci(values, rng, 10000)) if len(
        values) else "n/a"

  seconds = sum(cell["seconds"] for by_g in results.values() for cell in by_g.values())
  lines = [
      "# GRPO's gradient at the start of training: decisive and filler parts", "",
      f"Seeds {list(study.seeds)}; {study.mechanism_batches} fresh batches of "
      f"{study.prompts_per_step} prompts × G responses per measurement, from the starting "
      "policy (after the regime's SFT, before any update). GRPO's gradient (RMS-scaled "
      "advantages, the sweep's objective) is split into its decisive-token and filler "
      "parts, g = g_decisive + g_filler; its cosine with the exact-credit gradient and its "
      "signal fraction |mean g|² / mean |g|² are taken over the same batches. Means over "
      "seeds with 95% bootstrap intervals; the ratio and the filler share leave out a seed "
      "whose batches gave GRPO no gradient (every group with equal rewards).", "",
      f"Written {time.strftime('%Y-%m-%d')} on {report.machine()}; jaxcredit "
      f"{sweep.commit()}; {seconds / 60:.1f} min of compiling and measuring in all.", "",
      *([f"Not measured: {', '.join(missing)}.", ""] if missing else []),
      "| regime | T | filler entropy (nats) | G | \\|g_decisive\\| | \\|g_filler\\| | "
      "\\|g_filler\\| / \\|g_decisive\\| | filler share | cosine to exact | signal fraction |",
      "|---|---|---|---|---|---|---|---|---|---|"]
  for regime, by_g in results.items():
    for g, cell in sorted(by_g.items()):
      share = _ratio(cell) / (1 + _ratio(cell))  # |g_filler| / (|g_filler| + |g_decisive|)
      lines.append(
          f"| {regime} | {study.regimes[regime].task.length} | "
          f"{np.mean(cell['filler_entropy']):.2f} | {g} | {np.mean(cell['decisive_norm']):.3g} | "
          f"{np.mean(cell['filler_norm']):.3g} | {ci(_ratio(cell))} | {ci(share)} | "
          f"{ci(cell['cosine_to_exact'])} | {ci(cell['signal_fraction'])} |")
  fitted = slopes(study, results, rng)
  if fitted:
    lines += ["", f"Slope of log(|g_filler| / |g_decisive|) on log(T − K), OLS over the runs "
              f"(95% bootstrap). The mechanism predicts {PREDICTED_SLOPE} (the filler part's "
              "power grows with the number of filler tokens; module docstring).", "",
              "| filler regime | G | slope [95% CI] | prediction within the interval |",
              "|---|---|---|---|"]
    for (name, g), (slope, low, high) in sorted(fitted.items()):
      lines.append(f"| {name} | {g} | {slope:+.3f} [{low:+.3f}, {high:+.3f}] | "
                   f"{'yes' if low <= PREDICTED_SLOPE <= high else 'no'} |")
  lines += ["", *ratio_figure(study, workdir, results), ""]
  return "\n".join(lines)


def ratio_figure(study, workdir: pathlib.Path, results: dict) -> list[str]:
  """ratio.png: |g_filler| / |g_decisive| (mean over seeds) against T - K on log-log axes,
  one panel per filler regime measured at two lengths or more, one line per G, and the
  predicted slope 1/2 through the shortest length's mean over G."""
  plt = report._pyplot()
  families = [name for name in dict.fromkeys(family(regime) for regime in results)
              if len(_lengths(study, results, name)) > 1]
  if plt is None or not families:
    return []
  fig, axes = plt.subplots(1, len(families), figsize=(5 * len(families), 4), squeeze=False)
  for ax, name in zip(axes[0], families):
    lengths = _lengths(study, results, name)
    for g in study.group_sizes:
      measured = {n: np.nanmean(_ratio(results[regime][g])) for n, regime in lengths.items()
                  if g in results[regime]}
      ax.plot(list(measured), list(measured.values()), marker="o", label=f"G = {g}")
    start = min(lengths)
    anchor = np.mean([np.nanmean(_ratio(cell)) for cell in results[lengths[start]].values()])
    n = np.asarray(sorted(lengths), float)
    ax.plot(n, anchor * np.sqrt(n / start), "k--", lw=1, label="∝ √(T − K)")
    ax.set(xscale="log", yscale="log", xlabel="filler tokens T − K", title=name,
           ylabel="|g_filler| / |g_decisive| at the start")
    ax.set_xticks(list(lengths), [str(n) for n in lengths])
    ax.tick_params(axis="both", which="minor", labelbottom=False, labelleft=False)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(workdir / "ratio.png", dpi=120)
  plt.close(fig)
  return ["![GRPO's filler-to-decisive gradient ratio against the filler tokens](ratio.png)",
          "", "What to see: if the filler noise is a sum of uncorrelated per-token scores, "
          "each G's line runs parallel to the dashed √(T − K) line; a line above it means "
          "the filler scores add more than independently, one below it less."]


def _lengths(study, results: dict, name: str) -> dict:
  """{T - K: regime} of the family's regimes."""
  return dict(sorted((filler_tokens(study, regime), regime) for regime in results
                     if family(regime) == name))
