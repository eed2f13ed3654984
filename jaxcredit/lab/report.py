"""The study's report: sample-efficiency statistics over seeds, oracle-agreement
tables, the Monte-Carlo check, and figures (learning curves with bootstrap
bands, credit heatmaps). Figures need matplotlib (`pip install jaxcredit[plot]`);
without it the report says so and keeps every table.
"""

import json
import os
import pathlib
import platform

import jax
import numpy as np

METRICS = [("r_pool", "r_pool"), ("ceiling", "√η²"), ("r2_within", "R²_w"), ("spearman", "Spearman"),
           ("sa", "SA"), ("sa_weighted", "SA_w"), ("dm", "DM"), ("dm_oracle", "DM oracle"),
           ("top_k", "top-k"), ("nmse_scale", "NMSE_scale")]


def auc(steps, accuracy, total: int) -> float:
  """(1 / total) * integral of accuracy over steps (trapezoid, held flat after the last eval)."""
  steps, accuracy = np.asarray(steps, float), np.asarray(accuracy, float)
  if steps[-1] < total:
    steps, accuracy = np.append(steps, total), np.append(accuracy, accuracy[-1])
  return float(np.sum(np.diff(steps) * (accuracy[1:] + accuracy[:-1]) / 2) / total)


def steps_to_threshold(steps, accuracy, threshold: float) -> float | None:
  """First crossing of `threshold`, linearly interpolated; None if never reached."""
  for i, value in enumerate(accuracy):
    if value >= threshold:
      if i == 0:
        return float(steps[0])
      s0, s1, a0 = steps[i - 1], steps[i], accuracy[i - 1]
      return float(s0 + (threshold - a0) / (value - a0) * (s1 - s0))
  return None


def bootstrap_ci(values, rng: np.random.Generator, draws: int) -> tuple[float, float, float]:
  """Mean and 95% percentile-bootstrap interval of the mean."""
  values = np.asarray(values, float)
  if len(values) == 1:
    return float(values[0]), float(values[0]), float(values[0])
  means = rng.choice(values, (draws, len(values))).mean(axis=1)
  return float(values.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def summarise(study, curves: dict) -> dict:
  """Per estimator: final accuracy (mean of the last 3 evals), AUC, steps to
  threshold, per seed; and paired AUC differences against grpo."""
  total = study.train.rl.steps
  summary = {}
  for name, runs in curves.items():
    per_seed = {}
    for seed, curve in runs.items():
      per_seed[seed] = {
          "final": float(np.mean(curve["accuracy"][-3:])),
          "auc": auc(curve["step"], curve["accuracy"], total),
          "tau": steps_to_threshold(curve["step"], curve["accuracy"], study.threshold),
          "gen_tokens": curve["gen_tokens"][-1] if curve["gen_tokens"] else 0,
      }
    summary[name] = per_seed
  return summary


def _fmt(mean, low, high) -> str:
  return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def efficiency_table(study, summary: dict, rng) -> list[str]:
  lines = ["| estimator | final accuracy [95% CI] | AUC [95% CI] | steps to θ (reached) | ΔAUC vs grpo [95% CI] | "
           "generated tokens / run | final per seed |", "|---|---|---|---|---|---|---|"]
  base = summary.get("grpo")
  for name, per_seed in summary.items():
    seeds = sorted(per_seed)
    finals = [per_seed[s]["final"] for s in seeds]
    aucs = [per_seed[s]["auc"] for s in seeds]
    taus = [per_seed[s]["tau"] for s in seeds]
    reached = [t for t in taus if t is not None]
    tau = f"{np.median(reached):.0f} ({len(reached)}/{len(taus)})" if reached else f"— (0/{len(taus)})"
    delta = "—"
    if base is not None and name != "grpo" and set(base) == set(per_seed):
      delta = _fmt(*bootstrap_ci([per_seed[s]["auc"] - base[s]["auc"] for s in seeds], rng, study.bootstrap))
    tokens = np.mean([per_seed[s]["gen_tokens"] for s in seeds])
    lines.append(f"| {name} | {_fmt(*bootstrap_ci(finals, rng, study.bootstrap))} | "
                 f"{_fmt(*bootstrap_ci(aucs, rng, study.bootstrap))} | {tau} | {delta} | {tokens:,.0f} | "
                 f"{', '.join(f'{f:.2f}' for f in finals)} |")
  return lines


def agreement_tables(workdir: pathlib.Path) -> list[str]:
  path = workdir / "scores.jsonl"
  if not path.exists():
    return ["(no scores.jsonl: the scoring run was not part of this study)"]
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  lines = []
  for step in sorted({r["step"] for r in rows}):
    lines += [f"\nBatch of RL step {step} (the first seed's GRPO run, before its update; token credit vs exact "
              "oracle; — = undefined):\n",
              "| estimator | " + " | ".join(label for _, label in METRICS) + " | extra gen tokens |",
              "|---|" + "---|" * (len(METRICS) + 1)]
    for r in (r for r in rows if r["step"] == step):
      cells = [f"{r[k]['value']:.3f}" if r[k]["defined"] else "—" for k, _ in METRICS]
      lines.append(f"| {r['estimator']} | " + " | ".join(cells) + f" | {r['gen_tokens']:,} |")
  return lines


def mc_table(workdir: pathlib.Path) -> list[str]:
  path = workdir / "mc_check.jsonl"
  if not path.exists():
    return []
  lines = ["| RL step | states (0.05 ≤ V ≤ 0.95) | K | X² | null 0.999 quantile | p | mean z | mean z² | "
           "passes T2 | max telescoping error (T1) |", "|---|---|---|---|---|---|---|---|---|---|"]
  for line in path.read_text().splitlines():
    r = json.loads(line)
    lines.append(f"| {r['step']} | {r['states']} | {r['k']} | {r['x2']:.1f} | {r['x2_null_q999']:.1f} | "
                 f"{r['p_value']:.3f} | {r['mean_z']:+.3f} | {r['mean_z2']:.3f} | {r['passes_t2']} | "
                 f"{r['telescoping_error']:.1e} |")
  return lines


def figures(study, workdir: pathlib.Path, curves: dict) -> list[str]:
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return ["(figures skipped: matplotlib is not installed; `pip install jaxcredit[plot]`)"]
  rng = np.random.default_rng(0)
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  for name, runs in curves.items():
    steps = np.asarray(next(iter(runs.values()))["step"])
    accuracy = np.asarray([runs[s]["accuracy"] for s in sorted(runs)])
    tokens = np.asarray([runs[s]["gen_tokens"] for s in sorted(runs)], float).mean(axis=0)
    bands = np.asarray([bootstrap_ci(column, rng, 1000) for column in accuracy.T])
    for ax, x in zip(axes, (steps, tokens)):
      ax.plot(x, bands[:, 0], label=name)
      ax.fill_between(x, bands[:, 1], bands[:, 2], alpha=0.2)
  axes[0].set_xlabel("RL step (policy samples)")
  axes[1].set_xlabel("generated tokens (policy samples + estimator rollouts)")
  for ax in axes:
    ax.set_ylabel("greedy eval accuracy")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(workdir / "learning_curves.png", dpi=120)
  plt.close(fig)
  out = ["![learning curves](learning_curves.png)"]
  dumps = sorted(workdir.glob("credit_dump_step*.npz"), key=lambda p: int(p.stem.split("step")[1]))
  if dumps:
    dump = np.load(dumps[len(dumps) // 2])
    names = [n for n in ("oracle", "grpo", "vineppo", "oracle_seq", "entropy80", "rloo") if n in dump]
    rewards = dump["rewards"]
    picks = list(np.flatnonzero(rewards > 0.5)[:2]) + list(np.flatnonzero(rewards <= 0.5)[:2])
    mask, decisive = dump["mask"], dump["decisive"]
    fig, axes = plt.subplots(len(picks), 1, figsize=(10, 1.0 + 0.45 * len(names) * len(picks)), squeeze=False)
    for ax, row in zip(axes[:, 0], picks):
      columns = np.flatnonzero(mask[row])
      grid = np.stack([dump[n][row, columns] for n in names])
      grid = grid / np.maximum(np.abs(grid).max(axis=1, keepdims=True), 1e-12)
      ax.imshow(grid, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
      ax.set_yticks(range(len(names)), names, fontsize=7)
      ax.set_xticks(range(len(columns)), [str(i) for i in range(len(columns))], fontsize=6)
      for i, column in enumerate(columns):
        if decisive[row, column]:
          ax.add_patch(plt.Rectangle((i - 0.5, -0.5), 1, len(names), fill=False, lw=1.2, ec="k"))
      ax.set_title(f"response {row}, R = {rewards[row]:.0f} (decisive positions outlined; each row / its max |·|)",
                   fontsize=8)
    fig.tight_layout()
    fig.savefig(workdir / "credit_heatmap.png", dpi=120)
    plt.close(fig)
    out.append(f"\nCredit of 4 responses from RL step {dumps[len(dumps) // 2].stem.split('step')[1]}:\n\n"
               "![credit heatmaps](credit_heatmap.png)")
  return out


def _machine() -> str:
  return f"{platform.machine()} ({os.cpu_count()} cores, jax {jax.__version__} on {jax.default_backend()})"


def write(study, workdir: pathlib.Path, curves: dict, wall: dict) -> None:
  """Writes workdir/report.md (and its figures)."""
  rng = np.random.default_rng(0)
  summary = summarise(study, curves)
  train = study.train
  seeds = list(study.seeds)
  lines = [
      f"# Credit study: {study.preset} preset",
      "",
      f"Task: `{train.task.name}` {dict(train.task.options)}; model: `{train.model.preset}` with "
      f"{dict(train.model.overrides)}; {train.rl.steps} RL steps of {train.rl.prompts_per_step} prompts × "
      f"{train.rl.group_size} samples; Adam {train.rl.learning_rate}; PPO-clip, one gradient step per batch; "
      f"advantages {'RMS-scaled' if study.scale == 'rms' else 'native'}; seeds {seeds}. "
      f"Wall time of all runs {wall.get('total (all runs)', 0):.0f} s on {_machine()}.",
      "",
      "## Sample efficiency",
      "",
      f"Greedy accuracy on {train.task.test_size} held-out prompts. Final = mean of the last 3 evaluations; "
      f"AUC = mean accuracy over training; θ = {study.threshold}. Intervals: 95% percentile bootstrap over seeds "
      "(paired by seed for ΔAUC)" + (" — with fewer than 5 seeds they are optimistic." if len(seeds) < 5 else "."),
      "",
      *efficiency_table(study, summary, rng),
      "",
      "## Oracle agreement",
      "",
      "Each estimator's credit on the same batch, against the exact oracle A(s_t, y_t). r_pool: pooled Pearson; "
      "√η²: the best r_pool any sequence-level (constant per response) credit can reach; R²_w: within-response "
      "credit explained; SA/SA_w: sign agreement (|A| above noise); DM: share of |credit| on decisive positions "
      "(oracle's beside it); top-k: overlap of the top-20% tokens by |credit|; NMSE_scale: error after the best "
      "non-negative rescaling. ppo_gae's critic and PRIME's PRM are not scored here (they live in their own "
      "runs).",
      *agreement_tables(workdir),
      "",
      "## Monte-Carlo values vs exact values",
      "",
      "Plain MC values (K continuations per state) against the exact values on the same responses (LAB.md 2.4): "
      "X² against its exact parametric-bootstrap null; T1 checks that MC credit telescopes to R − V̂(x).",
      "",
      *mc_table(workdir),
      "",
      "## Figures",
      "",
      *figures(study, workdir, curves),
      "",
      "## Wall time",
      "",
      "| run | seconds |",
      "|---|---|",
      *[f"| {k} | {v:.0f} |" for k, v in wall.items()],
  ]
  (workdir / "report.md").write_text("\n".join(lines) + "\n")
