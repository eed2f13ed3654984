"""The study's report: sample-efficiency statistics over seeds, oracle-agreement
tables, the Monte-Carlo check, and figures (learning curves with bootstrap
bands, credit heatmaps). Figures need matplotlib (`pip install jaxcredit[plot]`);
without it the report says so and keeps every table.
"""

import csv
import json
import os
import pathlib
import platform

import jax
import numpy as np
import scipy.stats

from jaxcredit.lab import exact_metrics
from jaxcredit.lab.statistics import MIN_SEEDS, bootstrap_ci, reported_ci
from jaxcredit.train import export

METRICS = [("r_pool", "r_pool"), ("ceiling", "√η²"), ("r2_within", "R²_w"),
           ("spearman", "Spearman"), ("sa", "SA"), ("sa_weighted", "SA_w"), ("dm", "DM"),
           ("dm_oracle", "DM oracle"), ("top_k", "top-k"), ("nmse_scale", "NMSE_scale"),
           ("rcn", "RCN"), ("bias_ratio", "bias ratio")]


def t_interval(values) -> tuple[float, float | None, float | None]:
  """Mean and Student-t 95% interval of the mean, mean +- t_{0.975, n-1} s / sqrt(n)
  (s: the sample standard deviation); no interval (None, None) for one value."""
  values = np.asarray(values, float)
  if len(values) < 2:
    return float(values.mean()), None, None
  half = scipy.stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
  return float(values.mean()), float(values.mean() - half), float(values.mean() + half)


def fmt_interval(mean, low, high) -> str:
  """"mean [low, high]", or "mean (n/a)" when there is no interval."""
  return f"{mean:.3f} (n/a)" if low is None else _fmt(mean, low, high)


def summarise(curves: dict, *, level: float = 0.9,
              final_share: float | None = None) -> tuple[dict, dict]:
  """({estimator: {seed: metrics}}, {"low", "high", "level"}) of one cell's
  {estimator: {seed: exact curve}}
  (`exact_metrics.read_curve`): final J (the plateau reached: the mean of the last 3
  measurements, or with `final_share` of those over the last `final_share` of the run's
  updates), final pass@k, AUC of J over log10 generated tokens on the cell's common range,
  tokens and updates to reach `level` x the best arm's mean final J (None if never), the
  mean fraction of zero-variance groups, and the generated tokens and updates."""
  runs = [curve for by_seed in curves.values() for curve in by_seed.values()]
  low = min(t for curve in runs for t in curve["gen_tokens"] if t > 0)
  high = max(curve["gen_tokens"][-1] for curve in runs)

  def final(curve, values) -> float:
    if final_share is None:
      return float(np.mean(values[-3:]))
    updates = np.asarray(curve["updates"], np.float64)
    return float(np.mean(np.asarray(values)[updates >= (1 - final_share) * updates[-1] - 1e-6]))

  best = max(np.mean([final(c, c["success"]) for c in by_seed.values()])
             for by_seed in curves.values())
  return {name: {seed: {
      "final": final(curve, curve["success"]),
      "pass@k": {k: final(curve, values) for k, values in curve["pass@k"].items()},
      "auc": exact_metrics.auc_log_tokens(curve["gen_tokens"], curve["success"], low, high),
      "tau": exact_metrics.tokens_to_reach(curve["gen_tokens"], curve["success"], level * best),
      "tau_updates": exact_metrics.tokens_to_reach(curve["updates"], curve["success"],
                                                   level * best),
      "updates": curve["updates"][-1],
      "zero_variance_groups": curve["zero_variance_groups"],
      "gen_tokens": curve["gen_tokens"][-1],
  } for seed, curve in by_seed.items()} for name, by_seed in curves.items()}, {
      "low": low, "high": high, "level": level * best}


def ci_text(values, rng: np.random.Generator, draws: int) -> str:
  """"mean [95% bootstrap CI]", or "mean (n/a)" below MIN_SEEDS values."""
  return fmt_interval(*reported_ci(list(values), rng, draws))


def _fmt(mean, low, high) -> str:
  return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def efficiency_table(summary: dict, level: float, rng, draws: int,
                     pass_k: str = "16") -> list[str]:
  """One row per estimator: final J (mean with its interval, and the interquartile mean:
  robust to the few seeds that stall), pass@k, AUC over log tokens and its paired
  difference from GRPO's (same seeds), tokens to `level`, zero-variance groups, tokens per
  run."""
  lines = [f"| estimator | final J(π) | IQM final J | pass@{pass_k} | AUC over log₁₀ tokens | "
           f"ΔAUC vs grpo (paired) | tokens to J = {level:.3f} (reached) | "
           "zero-variance groups | generated tokens / run | final J per seed |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  base = summary.get("grpo")
  for name, per_seed in summary.items():
    seeds = sorted(per_seed)
    column = lambda key: [per_seed[s][key] for s in seeds]
    reached = [t for t in column("tau") if t is not None]
    tau = (f"{np.median(reached):,.0f} ({len(reached)}/{len(seeds)})" if reached
           else f"— (0/{len(seeds)})")
    delta = "—"
    if base is not None and name != "grpo" and set(base) == set(per_seed):
      delta = ci_text([per_seed[s]["auc"] - base[s]["auc"] for s in seeds], rng, draws)
    passes = [per_seed[s]["pass@k"].get(pass_k) for s in seeds]
    zero = [z for z in column("zero_variance_groups") if z is not None]
    lines.append(
        f"| {name} | {ci_text(column('final'), rng, draws)} | "
        f"{scipy.stats.trim_mean(column('final'), 0.25):.3f} | "
        + (ci_text(passes, rng, draws) if None not in passes else "—")
        + f" | {ci_text(column('auc'), rng, draws)} | {delta} | {tau} | "
        + (f"{np.mean(zero):.2f}" if zero else "—")
        + f" | {np.mean(column('gen_tokens')):,.0f} | "
        + ", ".join(f"{f:.2f}" for f in column("final")) + " |")
  return lines


def agreement_tables(workdir: pathlib.Path) -> list[str]:
  path = workdir / "scores.jsonl"
  if not path.exists():
    return ["(no scores.jsonl: the scoring run was not part of this study)"]
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  lines = []
  for step in sorted({r["step"] for r in rows}):
    lines += [f"\nBatch of RL step {step} (the first seed's GRPO run, before its update; "
              "token credit vs exact oracle; — = undefined):\n",
              "| estimator | " + " | ".join(label for _, label in METRICS)
              + " | extra gen tokens |",
              "|---|" + "---|" * (len(METRICS) + 1)]
    for r in (r for r in rows if r["step"] == step):
      cells = [f"{r[k]['value']:.3f}" if k in r and r[k]["defined"] else "—" for k, _ in METRICS]
      lines.append(f"| {r['estimator']} | " + " | ".join(cells) + f" | {r['gen_tokens']:,} |")
  return lines


def write_scores_csv(workdir: pathlib.Path) -> None:
  """scores.csv: one row per (task, step, estimator), one column per statistic (empty when
  undefined)."""
  path = workdir / "scores.jsonl"
  if not path.exists():
    return
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  stats = [k for k in rows[0] if isinstance(rows[0][k], dict)]
  with open(workdir / "scores.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["task", "step", "estimator", "gen_tokens", *stats])
    for r in rows:
      writer.writerow([r.get("task", ""), r["step"], r["estimator"], r["gen_tokens"],
                       *[r[k]["value"] if k in r and r[k]["defined"] else "" for k in stats]])


def mc_table(workdir: pathlib.Path) -> list[str]:
  path = workdir / "mc_check.jsonl"
  if not path.exists():
    return []
  lines = ["| RL step | states (0.05 ≤ V ≤ 0.95) | K | X² | null 0.999 quantile | p | mean z | "
           "mean z² | passes T2 | max telescoping error (T1) | rb: 95% coverage | rb: mean z² | "
           "rb: mean error ± SE |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for line in path.read_text().splitlines():
    r = json.loads(line)
    rb = (f"{r['rb_coverage']:.3f} | {r['rb_mean_z2']:.3f} | "
          f"{r['rb_mean_error']:+.4f} ± {r['rb_error_se']:.4f}" if "rb_coverage" in r
          else "— | — | —")
    lines.append(
        f"| {r['step']} | {r['states']} | {r['k']} | {r['x2']:.1f} | {r['x2_null_q999']:.1f} | "
        f"{r['p_value']:.3f} | {r['mean_z']:+.3f} | {r['mean_z2']:.3f} | {r['passes_t2']} | "
        f"{r['telescoping_error']:.1e} | {rb} |")
  return lines


def _pyplot():
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return None
  return plt


def learning_curves(workdir: pathlib.Path, task: str, curves: dict, *,
                    charged: bool = False) -> list[str]:
  """learning_curves_<task>.png: mean exact J(pi) over seeds (a 95% bootstrap band from 5
  seeds) against updates and against generated tokens on a log axis; charged=True:
  learning_curves_<task>_charged.png, against the tokens each run is charged (its
  "charged_tokens", else its generated tokens)."""
  plt = _pyplot()
  if plt is None:
    return ["(figures skipped: matplotlib is not installed; `pip install jaxcredit[plot]`)"]
  rng = np.random.default_rng(0)
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  for name, runs in curves.items():
    updates = np.asarray(next(iter(runs.values()))["updates"])
    success = np.asarray([runs[s]["success"] for s in sorted(runs)])
    tokens = np.asarray([runs[s].get("charged_tokens", runs[s]["gen_tokens"]) if charged
                         else runs[s]["gen_tokens"] for s in sorted(runs)], float).mean(axis=0)
    mean = success.mean(axis=0)
    positive = tokens > 0
    for ax, x, keep in ((axes[0], updates, slice(None)), (axes[1], tokens, positive)):
      ax.plot(x[keep], mean[keep], label=name)
      if len(runs) >= MIN_SEEDS:
        bands = np.asarray([bootstrap_ci(c, rng, 1000) for c in success.T])
        ax.fill_between(x[keep], bands[keep, 1], bands[keep, 2], alpha=0.2)
  axes[0].set_xlabel("updates")
  axes[1].set_xlabel("charged tokens (policy samples + Monte-Carlo continuations; log scale)"
                     if charged else
                     "generated tokens (policy samples + estimator rollouts; log scale)")
  axes[1].set_xscale("log")
  for ax in axes:
    ax.set_ylabel("exact J(π) on held-out prompts")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  axes[0].set_title(task)
  fig.tight_layout()
  name = f"learning_curves_{task}{'_charged' if charged else ''}.png"
  fig.savefig(workdir / name, dpi=120)
  plt.close(fig)
  return [f"![learning curves on {task}{' at charged tokens' if charged else ''}]({name})"]


def credit_heatmap(workdir: pathlib.Path) -> list[str]:
  """credit_heatmap.png: oracle vs estimator credit on 2 successes and 2 failures of the
  middle scored batch, each estimator's credit divided by its RMS over the batch's actions
  (the scale the study trains with), on one colour scale with its bar."""
  plt = _pyplot()
  dumps = sorted(workdir.glob("credit_dump_step*.npz"), key=lambda p: int(p.stem.split("step")[1]))
  if plt is None or not dumps:
    return []
  dump = np.load(dumps[len(dumps) // 2])
  names = [
      n for n in ("oracle", "grpo", "ppo_gae", "vineppo", "oracle_seq", "ktae", "entropy80")
      if n in dump
  ]
  rewards, mask, decisive = dump["rewards"], dump["mask"], dump["decisive"]
  valid = np.asarray(mask, bool)
  rms = {n: max(float(np.sqrt(np.mean(dump[n][valid] ** 2))), 1e-12) for n in names}
  picks = list(np.flatnonzero(rewards > 0.5)[:2]) + list(np.flatnonzero(rewards <= 0.5)[:2])
  columns_of = [np.flatnonzero(mask[row]) for row in picks]  # each response's action positions
  grids = [np.stack([dump[n][row, columns] / rms[n] for n in names])
           for row, columns in zip(picks, columns_of)]
  limit = max(float(np.abs(grid).max()) for grid in grids) if grids else 1.0
  fig, axes = plt.subplots(len(picks), 1, figsize=(10, 1.0 + 0.45 * len(names) * len(picks)),
                           squeeze=False)
  for ax, row, columns, grid in zip(axes[:, 0], picks, columns_of, grids):
    image = ax.imshow(grid, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xticks(range(len(columns)), [str(i) for i in range(len(columns))], fontsize=6)
    for i, column in enumerate(columns):
      if decisive[row, column]:
        ax.add_patch(plt.Rectangle((i - 0.5, -0.5), 1, len(names), fill=False, lw=1.2, ec="k"))
    ax.set_title(f"response {row}, R = {rewards[row]:.0f} (decisive positions outlined)",
                 fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01, label="credit / its batch RMS")
  fig.tight_layout()
  fig.savefig(workdir / "credit_heatmap.png", dpi=120)
  plt.close(fig)
  step = dumps[len(dumps) // 2].stem.split("step")[1]
  return [f"Credit of 4 responses from RL step {step} (blue +, red −; each estimator's credit "
          "divided by its RMS over the batch's actions, one colour scale):", "",
          "![credit heatmaps](credit_heatmap.png)"]


def viewer_links(study, workdir: pathlib.Path, curves: dict) -> list[str]:
  """A section linking each cell's credit viewer page (its first seed's run, where it exported
  per-token credit); `python -m jaxcredit.view WORKDIR` writes the pages."""
  seed = list(study.seeds)[0]
  cells = [(task, name, pathlib.Path("runs", task, name, f"seed{seed}"))
           for task in curves for name in curves[task]]
  cells = [(task, name, run) for task, name, run in cells
           if (workdir / run / export.DIRECTORY).is_dir()]
  if not cells:
    return []
  return [
      "## Credit viewer",
      "",
      f"Each cell's per-token credit (seed {seed}; key_token's with the exact oracle beside it). "
      "`python -m jaxcredit.view WORKDIR` writes these pages (self-contained HTML).",
      "",
      "| task | estimator | page |",
      "|---|---|---|",
      *[f"| {task} | {name} | [{run}/credit.html]({run}/credit.html) |"
        for task, name, run in cells],
      "",
  ]


def machine() -> str:
  return (f"{platform.machine()} ({os.cpu_count()} cores, jax {jax.__version__} on "
          f"{jax.default_backend()})")


def _task_section(study, workdir: pathlib.Path, task: str, curves: dict, rng) -> list[str]:
  spec = study.tasks[task]
  train = spec.train
  summary, span = summarise(curves)
  sft = (f"SFT warm start (up to {train.sft.max_steps} steps, stopped at greedy accuracy "
         f"{train.sft.target_accuracy}), then " if train.sft.max_steps else "")
  return [
      f"## Sample efficiency: {task}",
      "",
      f"`{train.task.name}` {dict(train.task.options)}; model `{train.model.preset}` with "
      f"{dict(train.model.overrides)}; {sft}{train.rl.steps} RL steps of "
      f"{train.rl.prompts_per_step} prompts × {train.rl.group_size} samples; Adam "
      f"{train.rl.learning_rate}. J(π): the exact expected success on {train.task.test_size} "
      f"held-out prompts (mean V^π(x) from the oracle), every {train.rl.eval_every} updates; "
      "final = mean of the last 3 measurements; pass@k = mean 1 − (1 − V^π(x))^k; AUC = mean J "
      f"over log₁₀ generated tokens on [{int(span['low']):,}, {int(span['high']):,}] (the "
      "cell's common range; a run that ends earlier is held at its last value there, which "
      "understates it if it would have kept learning); the level is 0.9 × the best arm's mean "
      "final J. Intervals: 95% bootstrap "
      f"over seeds from {MIN_SEEDS} seeds, n/a below.",
      "",
      *efficiency_table(summary, span["level"], rng, study.bootstrap),
      "",
      *learning_curves(workdir, task, curves),
      "",
  ]


def write(study, workdir: pathlib.Path, curves: dict, wall: dict) -> None:
  """Writes workdir/report.md (and its figures) from {task: {estimator: {seed: curve}}}."""
  rng = np.random.default_rng(0)
  seeds = list(study.seeds)
  scale = ("divided by their batch RMS (scale-matched)" if study.scale == "rms"
           else "at their native scale")
  lines = [
      f"# Credit study: {study.preset} preset",
      "",
      "Every estimator trains the same policy per seed (initialisation, prompts, evaluation) "
      "with PPO-clip and one gradient step per batch (a plain policy gradient), advantages "
      f"{scale}, no KL or entropy terms. Seeds {seeds}; intervals are 95% percentile bootstraps "
      f"over seeds (paired by seed for ΔAUC), printed as n/a below {MIN_SEEDS} seeds. "
      "Generated tokens count policy samples plus estimator rollouts (VinePPO); the oracle's "
      f"enumeration is not charged. Wall time of all runs {wall.get('total (all runs)', 0):.0f} s "
      f"on {machine()}.",
      "",
  ]
  for task in curves:
    lines += _task_section(study, workdir, task, curves[task], rng)
  lines += [
      "## Oracle agreement (key_token)",
      "",
      "Each estimator's credit on the same batch, against the exact oracle A(s_t, y_t). "
      "r_pool: pooled Pearson; √η²: the best r_pool any sequence-level (constant per response) "
      "credit can reach; R²_w: within-response credit explained; SA/SA_w: sign agreement (|A| "
      "above noise); DM: share of |credit| on decisive positions (oracle's beside it); top-k: "
      "overlap of the top-20% tokens by |credit|; NMSE_scale: error after the best non-negative "
      "rescaling; RCN / bias ratio: credit noise and bias on one probe response per group across "
      f"{study.resamples} resampled groups (and fresh Monte-Carlo keys), relative to the "
      "oracle's spread. ppo_gae is scored with a shadow critic trained on every batch of this "
      "GRPO run (read before its update on the scored batch); PRIME's PRM is not scored here (it "
      "lives in its own run).",
      *agreement_tables(workdir),
      "",
      *credit_heatmap(workdir),
      "",
      "## Monte-Carlo values vs exact values",
      "",
      "Plain MC values (K continuations per state) against the exact values on the same "
      "responses: X² against its exact parametric-bootstrap null; T1 checks that MC "
      "credit telescopes to R − V̂(x); rb: Rao-Blackwellised token credit (1 − π)(Q̂_y − Q̂₋) "
      "against the exact credit (Agresti–Coull SEs are conservative near 0 and 1, so coverage "
      "above 0.95 and mean z² below 1 are expected).",
      "",
      *mc_table(workdir),
      "",
      *viewer_links(study, workdir, curves),
      "## Wall time",
      "",
      "| run | seconds |",
      "|---|---|",
      *[f"| {k} | {v:.0f} |" for k, v in wall.items() if k != "this invocation"],
  ]
  (workdir / "report.md").write_text("\n".join(lines) + "\n")
  write_scores_csv(workdir)
