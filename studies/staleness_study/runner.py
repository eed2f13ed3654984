"""What staleness does to credit: key_token with the exact oracle, rollouts k updates old.

  python -m studies.staleness_study --config studies/staleness_study/configs.py:small --workdir DIR

For every staleness k (rl.max_staleness, "fixed": update t learns from rollouts of
the parameters after update t - k), estimator, correction (the policy loss that
handles the off-policy data) and seed, the study trains a policy with
`jaxcredit.train.loop.run` and measures its exact expected success

  J(pi) = mean over the held-out prompts x of V^pi(x)      (`exact_metrics`)

every `measure_every` updates, against the tokens generated so far (VinePPO's
Monte-Carlo rollouts included; the oracle's passes are not charged). The learner
recomputes old_logprobs (the proximal policy), so "none" (ppo_clip anchored at
them) is a plain policy gradient that ignores the staleness, and the corrections
weight or mask by pi_old / mu. At k = 0 every correction is ppo_clip (behaviour =
proximal = current, `tests/test_off_policy_losses.py`), so only "none" runs there.

Outputs in DIR: runs/k<k>/<estimator>/<correction>/seed<s>/ (training workdirs;
wall_seconds.json marks one complete and a rerun skips it), curves.json and
report.md.
"""

import json
import pathlib
import time

import ml_collections
import numpy as np

from jaxcredit.lab import exact_metrics
from studies.credit_study import runner as credit_study
from studies.credit_study.report import fmt_interval, machine, t_interval


def train_config(study, k: int, name: str, correction: str, seed: int,
                 data_dir: str) -> ml_collections.ConfigDict:
  """One run's training config: the credit study's for (estimator, seed) with staleness k,
  the correction's objective and the learner's recomputed old log-probs. rl.steps is
  `updates` + 1: the hook measures before each update, so the last measurement is the
  policy after `updates` updates."""
  config = credit_study.train_config(study, "key_token", name, seed, data_dir)
  config.rl.max_staleness, config.rl.staleness_mode = k, "fixed"
  config.rl.recompute_old_logprobs = True
  config.rl.steps = study.updates + 1
  config.objective = study.corrections[correction].to_dict()
  return config


def arms(study) -> list[tuple[int, str, str]]:
  """(k, estimator, correction) of every run; only "none" at k = 0."""
  return [(k, name, correction) for k in study.staleness for name in study.estimators
          for correction in (["none"] if k == 0 else list(study.corrections))]


def run(study, workdir: str) -> dict:
  """Trains every (k, estimator, correction, seed), writes curves.json and report.md."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "study_config.json").write_text(study.to_json_best_effort(indent=2))
  curves, wall, started = {}, 0.0, time.perf_counter()
  for k, name, correction in arms(study):
    for seed in study.seeds:
      run_dir = workdir / "runs" / f"k{k}" / name / correction / f"seed{seed}"
      wall += credit_study.train_once(
          train_config(study, k, name, correction, seed, str(workdir / "data")), run_dir,
          exact_metrics.hook(study.measure_every, ks=()),
          f"[staleness] k={k} {name} {correction} seed {seed}")
      curves.setdefault(f"k{k}", {}).setdefault(name, {}).setdefault(correction, {})[seed] = (
          exact_metrics.read_curve(run_dir))
  (workdir / "curves.json").write_text(json.dumps(curves, indent=1))
  (workdir / "report.md").write_text(report(study, curves, wall))
  print(f"[staleness] wrote {workdir / 'report.md'} ({time.perf_counter() - started:.0f} s)",
        flush=True)
  return curves


SUMMARIES = {"final": lambda success: success[-1], "mean": np.mean}  # of a run's J(pi) curve


def _per_seed(curves: dict, k: int, name: str, correction: str, summary: str) -> dict[int, float]:
  """seed -> the summary of the run's J(pi) (k = 0 ran "none" only: every correction is it)."""
  runs = curves[f"k{k}"][name]
  runs = runs["none"] if k == 0 else runs[correction]
  return {int(seed): float(SUMMARIES[summary](curve["success"])) for seed, curve in runs.items()}


def _paired(curves: dict, k: int, name: str, correction: str, summary: str) -> dict[int, float]:
  """seed -> its summary at k minus at k = 0, for the seeds run at both."""
  stale = _per_seed(curves, k, name, correction, summary)
  fresh = _per_seed(curves, 0, name, correction, summary)
  return {seed: stale[seed] - fresh[seed] for seed in stale if seed in fresh}


def _interval(values: dict) -> str:
  return fmt_interval(*t_interval(list(values.values()))) if values else ""


def report(study, curves: dict, wall_seconds: float) -> str:
  """The report's section: final and mean J(pi) per arm and k, and each arm's drop from
  k = 0 against GRPO's with the same correction, paired by seed; Student-t 95% intervals
  over seeds."""
  ks, names, corrections = list(study.staleness), list(study.estimators), list(study.corrections)
  lines = [
      "## What staleness does to credit", "",
      f"key_token {dict(study.train.task.options)}, exact J(pi) = mean V^pi(x) over "
      f"{study.train.task.test_size} held-out prompts, measured every "
      f"{study.measure_every} of {study.updates} updates ({study.train.rl.prompts_per_step} "
      f"prompts x {study.train.rl.group_size} samples each); seeds {list(study.seeds)}; "
      "intervals: Student-t 95% over seeds (n/a for one seed). Rollouts of update t come "
      "from the parameters after update t - k. final: J(pi) after the last update; mean: "
      "J(pi) averaged over the measurements (sample efficiency).", "",
      f"Written {time.strftime('%Y-%m-%d')} on {machine()}; the runs took "
      f"{wall_seconds / 60:.0f} min in all.", ""]
  tokens = {name: np.mean([curve["gen_tokens"][-1] for runs in curves[f"k{ks[0]}"][name].values()
                           for curve in runs.values()]) for name in names}
  lines += ["Generated tokens per run, up to the last measurement (the same at every k): "
            + "; ".join(f"{name} {count:,.0f}" for name, count in tokens.items()) + ".", ""]
  for summary in SUMMARIES:
    lines += [f"### {summary.capitalize()} J(pi)", "",
              "| estimator | correction | " + " | ".join(f"k = {k}" for k in ks) + " |",
              "|---|---|" + "---|" * len(ks)]
    for name in names:
      for correction in corrections:
        cells = [_interval(_per_seed(curves, k, name, correction, summary)) for k in ks]
        lines.append(f"| {name} | {correction} | " + " | ".join(cells) + " |")
    lines.append("")
  lines += ["### Drop from k = 0, and against GRPO's drop (paired by seed)", "",
            "J(k) - J(0) of each arm; `vs grpo`: that drop minus GRPO's with the same "
            "correction (negative: the estimator loses more to staleness than GRPO does).", "",
            "| estimator | correction | k | final: drop | final: vs grpo | mean: drop | "
            "mean: vs grpo |", "|---|---|---|---|---|---|---|"]
  for k in ks[1:]:
    for name in names:
      for correction in corrections:
        cells = []
        for summary in SUMMARIES:
          drop = _paired(curves, k, name, correction, summary)
          grpo = (_paired(curves, k, "grpo", correction, summary)
                  if name != "grpo" and "grpo" in names else {})
          cells += [_interval(drop),
                    _interval({seed: drop[seed] - grpo[seed] for seed in grpo if seed in drop})]
        lines.append(f"| {name} | {correction} | {k} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"
