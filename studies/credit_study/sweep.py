"""The credit study's sweep: regimes x samples per prompt (G) x arms at equal generated
tokens, learning rates tuned on excluded seeds, paired statistics against GRPO.

  python -m studies.credit_study --config studies/credit_study/configs.py:small --workdir DIR

Per regime (a key_token configuration, or target_sum's where the regime names
task_name="target_sum"), one batched program (`lab.batched`: arms, learning rates and
seeds vmapped) trains every arm at every learning rate of the grid on the tuning seeds at
G = tuning_group_size; per arm, the rate with the best mean AUC (exact J over log10
generated tokens) is chosen for every G. Then, per G, one program trains every arm on the
reported seeds at its rate. Every arm of a (regime, G) cell runs the same number of
updates of the same batch shape, so the runs compare at equal generated tokens (the
cell's budget; on target_sum, whose responses stop at EOS, the budget counts response
slots and each run's curve its own generated tokens). The tuning and each finished cell
are written once to DIR/cells/<regime>/{tuning,G<g>}.json and skipped on a rerun
(resumable).

The report (DIR/report.md, figures) holds, per cell: each arm's final J, pass@k, AUC and
tokens to 0.9 of the best plateau; differences from GRPO paired by seed with BCa bootstrap
intervals (n/a below 5 seeds), sign-flip p-values and sign-flip TOST within +-margin, both
Holm-adjusted across the arms, and a verdict (`tables.decide`); for arms charged more
than they sample (the Monte-Carlo ladder), J at the cell's budget of charged tokens against
GRPO's; and the localisation gain Delta_loc = oracle - oracle_seq against G (the tables:
`studies.credit_study.tables`).
"""

import dataclasses
import json
import multiprocessing
import os
import pathlib
import subprocess
import time
from concurrent import futures

import jax
import numpy as np

from jaxcredit import tasks
from jaxcredit.atomic import write_atomically
from jaxcredit.lab import batched, cells, compute, diagnostics, exact_metrics
from jaxcredit.models import preset
from studies.credit_study import report, tables


def regime_task(study, regime: str) -> str:
  """The task a regime trains on: its task_name, key_token unless it names one."""
  return study.regimes[regime].get("task_name", "key_token")


def cell_of(study, regime: str, group_size: int, budget: int | None = None) -> cells.Cell:
  """The batched cell of (regime, G) with every arm: the budget's updates (`budget`, else the
  G's token_budget, times the regime's budget_scale, 1 unless given), eval points spread
  evenly. A regime may change the study's policy (`model_overrides`, over the study's) and
  its prompts per update (`prompts_per_step`): H2's other two axes."""
  spec = study.regimes[regime]
  name = regime_task(study, regime)
  batchable = tasks.names("traceable")
  if name not in batchable:
    raise ValueError(f"Regime {regime!r}: unknown task_name {name!r}; known: "
                     f"{', '.join(batchable)}.")
  task_ops = tasks.get(name)
  task = task_ops.options(**spec.task)
  prompts_per_step = spec.get("prompts_per_step", study.prompts_per_step)
  tokens_per_update = prompts_per_step * group_size * task.length
  blocks = study.eval_points
  budget = (budget or study.token_budget[str(group_size)]) * spec.get("budget_scale", 1)
  updates = max(1, round(budget / tokens_per_update / blocks))
  plain = lambda value: value.to_dict() if hasattr(value, "to_dict") else value
  model_overrides = {**plain(study.model.overrides), **plain(spec.get("model_overrides", {}))}
  warmup = plain(spec.get("warmup"))
  if warmup is not None:
    if warmup.get("filler_probs") is not None:
      warmup["filler_probs"] = tuple(warmup["filler_probs"])
    warmup = cells.Warmup(**warmup)
  eval_at = log_spaced(updates * blocks, blocks) if study.get("eval_spacing") == "log" else None
  mechanism_evals = tuple(study.mechanism_evals) if study.get("mechanism_evals") else None
  if eval_at is not None and mechanism_evals is not None:  # fewer points once repeats drop
    mechanism_evals = tuple(sorted({min(i, len(eval_at)) for i in mechanism_evals}))
  return cells.Cell(
      task=task, model=preset(study.model.preset, vocab_size=task_ops.traceable.vocab_size,
                              **model_overrides),
      arms=tuple({"scale": "rms", "of": plain(arm)} for arm in study.arms.values()),
      prm_learning_rates=tuple(arm_settings(study, arm).get("prm_learning_rate")
                               for arm in study.arms),
      group_size=group_size, prompts_per_step=prompts_per_step,
      updates=updates * blocks, eval_every=updates, eval_prompts=study.eval_prompts,
      eval_at=eval_at, warmup=warmup,
      # The gradient measurements read key_token's decisive positions.
      mechanism_batches=study.get("mechanism_batches", 0) if name == "key_token" else 0,
      mechanism_evals=mechanism_evals)


def log_spaced(updates: int, points: int) -> tuple[int, ...]:
  """Update 0 and up to `points` - 1 updates spaced evenly in log between 1 and `updates`
  (rounded, repeats dropped): where J is measured to resolve a fast start."""
  spaced = np.unique(np.round(np.geomspace(1, updates, points)).astype(int))
  return (0, *(int(u) for u in spaced if u < updates))


ARM_SETTINGS = ("prm_learning_rate",)


def arm_settings(study, arm: str) -> dict:
  """What an arm's runs depend on besides its estimator and learning rate (recorded with
  them): its implicit PRM's Adam rate, when the study's `prm_learning_rates` names it."""
  rates = study.get("prm_learning_rates") or {}
  return {"prm_learning_rate": float(rates[arm])} if arm in rates else {}


def tuning_cell(study, regime: str) -> cells.Cell:
  """The cell the learning rates are tuned in: G = tuning_group_size, at the
  tuning_token_budget when the study sets one (else that G's budget)."""
  return cell_of(study, regime, study.tuning_group_size, study.get("tuning_token_budget"))


def run_curve(result: dict, row: int) -> dict:
  """One run's exact curve, in `exact_metrics.read_curve`'s layout."""
  return {"updates": result["updates"].tolist(), "success": result["success"][row].tolist(),
          "pass@k": {str(k): v[row].tolist() for k, v in result["pass@k"].items()},
          "gen_tokens": result["gen_tokens"][row].tolist(),
          # Only a run charged for more than it sampled (Monte-Carlo continuations) says so.
          **({"charged_tokens": result["charged_tokens"][row].tolist()}
             if np.any(result["charged_tokens"][row] != result["gen_tokens"][row]) else {}),
          "charged_flops": result["charged_flops"][row].tolist(),
          **({name: result[name][row].tolist() for name in ("final_keys", "key_targets")}
             if "final_keys" in result else {}),
          "zero_variance_groups": float(result["zero_variance_groups"][row].mean()),
          **({"filler_entropy": float(result["filler_entropy"][row, 0]),
              "noisy_tokens": float(result["noisy_tokens"][row].mean())}
             if "filler_entropy" in result else {}),
          **{name: result[name][row].tolist()
             for name in diagnostics.MECHANISM + diagnostics.RANKING if name in result},
          **({"mechanism_gen_tokens": result["mechanism_gen_tokens"][row].tolist()}
             if "mechanism_gen_tokens" in result else {})}


def _auc(curve: dict) -> float:
  tokens = curve["gen_tokens"]
  return exact_metrics.auc_log_tokens(tokens, curve["success"], tokens[1], tokens[-1])


PER_ARM = ("arms", "prm_learning_rates")  # Cell fields an arm's record holds (arm_settings)


def signature(cell: cells.Cell, seeds, learning_rates=None) -> dict:
  """What a piece's results depend on besides its arms, in JSON types: the cell's settings
  but its arms' (PER_ARM), the seeds, and for a tuning its grid of learning rates (a
  cell's arms record their own)."""
  settings = {f.name: getattr(cell, f.name) for f in dataclasses.fields(cell)
              if f.name not in PER_ARM}
  return json.loads(json.dumps({"cell": settings, "seeds": list(seeds),
                                "learning_rates": learning_rates}, default=repr))


def _piece_arms(study, path: pathlib.Path, expected: dict, *,
                grows_by_seed: bool = False) -> tuple[dict, list[str]]:
  """(what `path` holds, the study's arms it lacks): a piece is resumed arm by arm, and a
  file written under other settings is refused rather than mixed with new runs. With
  `grows_by_seed` (a cell) the seeds are not among those settings: a cell is resumed run
  by run and may hold more seeds than a study asks for."""
  if not path.exists():
    return {}, list(study.arms)
  written = json.loads(path.read_text())
  stored = written.get("signature")
  if grows_by_seed and stored is not None:
    stored, expected = ({k: v for k, v in sig.items() if k != "seeds"}
                        for sig in (stored, expected))
  refuse_other_settings(path, stored, expected)
  moved = [arm for arm in study.arms if arm in written["arms"] and arm_settings(study, arm)
           != {k: written["arms"][arm][k] for k in ARM_SETTINGS if k in written["arms"][arm]}]
  if moved:
    raise ValueError(f"{path} holds {', '.join(moved)} under other settings than the study's "
                     f"({', '.join(ARM_SETTINGS)}); move it away to rerun them.")
  return written, [arm for arm in study.arms if arm not in written["arms"]]


def refuse_other_settings(path: pathlib.Path, stored: dict | None, expected: dict) -> None:
  """Raises unless the `signature` stored in `path` is `expected` (naming the settings that
  differ): a file written under other settings is refused rather than mixed with new runs
  or overwritten. A setting the stored signature lacks reads as None (a Cell field added
  since, at a None default, changes no run)."""
  differ = ["signature (none stored)"] if stored is None else _differences(stored, expected)
  if differ:
    raise ValueError(f"{path} was written under other settings ({', '.join(differ)} differ); "
                     "move it away to rerun the piece under these.")


def _differences(stored: dict, expected: dict, prefix: str = "") -> list[str]:
  keys = set(stored) | set(expected) if isinstance(stored, dict) and isinstance(
      expected, dict) else ()
  if not keys:
    return [] if stored == expected else [prefix.rstrip(".")]
  return [d for k in sorted(keys)
          for d in _differences(stored.get(k), expected.get(k), f"{prefix}{k}.")]


def _write_piece(path: pathlib.Path, written: dict, new_arms: dict, expected: dict,
                 trained: dict, preset: str) -> dict:
  """The piece with `new_arms` (trained by `train_in_programs`) added, written atomically;
  returns it as read back (the same types as a resumed read). "spans" lists each write's
  [start, end] (epoch seconds) and "writers" its preset and compile seconds (pieces written
  before "writers" was recorded lack it, or lack its first entries); "seconds" and
  "compile_seconds" add up over the writes."""
  span = [trained["started_at"], time.time()]
  piece = {"signature": expected, "arms": {**written.get("arms", {}), **new_arms},
           "seconds": written.get("seconds", 0.0) + span[1] - span[0],
           "compile_seconds": written.get("compile_seconds", 0.0) + trained["compile_seconds"],
           "spans": [*written.get("spans", []), span],
           "writers": [*written.get("writers", []),
                       {"preset": preset, "compile_seconds": trained["compile_seconds"]}]}
  path.parent.mkdir(parents=True, exist_ok=True)
  write_atomically(path, lambda tmp: tmp.write_text(json.dumps(piece)))
  return json.loads(path.read_text())


def _runner(cell: cells.Cell, runners: dict) -> batched.Runner:
  """The cell's runner, built once (`runners`: (G, updates) -> Runner)."""
  key = (cell.group_size, cell.updates)
  if key not in runners:
    runners[key] = batched.Runner(cell)
  return runners[key]


def train_in_programs(study, runner: batched.Runner, runs: list) -> dict:
  """`runner.train(runs)` in programs of at most `study.runs_per_program` runs (all when
  unset; every program but the last has that width, and a run does not depend on its
  company), the results joined over the runs."""
  started_at = time.time()
  width = study.get("runs_per_program") or len(runs)
  parts = [runner.train(runs[i:i + width], width) for i in range(0, len(runs), width)]
  join = lambda *x: np.concatenate(x) if np.ndim(x[0]) >= 2 else x[0]  # [runs, ...]
  timed = ("compile_seconds", "run_seconds")
  return {**jax.tree.map(join, *[{k: v for k, v in part.items() if k not in timed}
                                 for part in parts]),
          **{k: sum(part[k] for part in parts) for k in timed}, "started_at": started_at}


TUNING_CRITERIA = {"auc": lambda auc, final: auc, "auc+final": lambda auc, final: auc + final}
"""How a tuning ranks the rates, from the tuning seeds' mean AUC and mean final J: by AUC
alone (speed), or by their sum (speed, and where a run ends: a rate at which exact credit
rises fast and then falls is not chosen for its speed alone)."""


def tune(study, regime: str, runners: dict, path: pathlib.Path) -> dict:
  """Tunes every arm at every rate of the grid on the tuning seeds in the `tuning_cell`; the
  rate of the best `tuning_criterion` (TUNING_CRITERIA, by default the mean AUC) is chosen
  (module docstring). An arm the study's `fixed_learning_rates` names takes that rate
  untuned (its tuning_auc empty). Arms already in `path` are read back. Returns {"arms":
  {arm: {"learning_rate", "tuning_auc" {rate: mean AUC}, "tuning_final" {rate: mean final
  J}}}, "seconds", "compile_seconds", "spans", "signature"}."""
  cell = tuning_cell(study, regime)
  criterion = study.get("tuning_criterion") or "auc"
  if criterion not in TUNING_CRITERIA:
    raise ValueError(f"unknown tuning_criterion {criterion!r}; known: "
                     f"{', '.join(TUNING_CRITERIA)}.")
  expected = signature(cell, study.tuning_seeds, list(study.learning_rates))
  if criterion != "auc":  # pieces tuned by AUC keep their signature
    expected["tuning_criterion"] = criterion
  written, missing = _piece_arms(study, path, expected)
  fixed = dict(study.get("fixed_learning_rates") or {})
  new = {arm: {"learning_rate": float(fixed[arm]), "tuning_auc": {}, **arm_settings(study, arm)}
         for arm in missing if arm in fixed}
  tuned = [arm for arm in missing if arm not in fixed]
  trained = {"started_at": time.time(), "compile_seconds": 0.0}
  if tuned:
    arms = list(study.arms)
    print(f"[sweep] {regime}: tuning {len(tuned)} arms at G={cell.group_size}", flush=True)
    runs = [(arms.index(arm), r, s) for arm in tuned for r in study.learning_rates
            for s in study.tuning_seeds]
    trained = train_in_programs(study, _runner(cell, runners), runs)
    auc, final = {}, {}
    for row, (a, rate, _) in enumerate(runs):
      curve = run_curve(trained, row)
      auc.setdefault(arms[a], {}).setdefault(rate, []).append(_auc(curve))
      final.setdefault(arms[a], {}).setdefault(rate, []).append(curve["success"][-1])
    rank = TUNING_CRITERIA[criterion]
    for arm, by_rate in auc.items():
      mean_auc = {r: float(np.mean(v)) for r, v in by_rate.items()}
      mean_final = {r: float(np.mean(v)) for r, v in final[arm].items()}
      new[arm] = {"learning_rate": max(mean_auc, key=lambda r: rank(mean_auc[r], mean_final[r])),
                  "tuning_auc": {str(r): a for r, a in mean_auc.items()},
                  "tuning_final": {str(r): f for r, f in mean_final.items()},
                  **arm_settings(study, arm)}
  if new:
    written = _write_piece(path, written, new, expected, trained, study.preset)
  return written


def tuning_line(study, tuned: dict) -> str:
  """The report's line on a regime's learning rates: each arm's rate, and the tuning seeds'
  mean AUC (and, where the tuning recorded it, mean final J) at each rate of the grid, with
  the rate each alone would choose where the criterion chose another."""
  arms = {arm: t for arm, t in tuned["arms"].items() if arm in study.arms}
  if not any("tuning_final" in t for t in arms.values()):
    return "Learning rates chosen (mean AUC of the tuning seeds at each rate): " + "; ".join(
        f"{arm} {t['learning_rate']:g} ("
        + (", ".join(f"{float(r):g}: {a:.3f}" for r, a in t["tuning_auc"].items())
           or "fixed, not tuned") + ")" for arm, t in arms.items())
  criterion = tuned.get("signature", {}).get("tuning_criterion", "auc")

  def described(t):
    if not t["tuning_auc"]:
      return "fixed, not tuned"
    pairs = ", ".join(f"{float(r):g}: {a:.3f} / {t['tuning_final'][r]:.3f}"
                      for r, a in t["tuning_auc"].items())
    alone = {name: float(max(values, key=values.get)) for name, values in
             (("AUC", t["tuning_auc"]), ("final J", t["tuning_final"]))}
    others = [f"{name} alone {rate:g}" for name, rate in alone.items()
              if rate != t["learning_rate"]]
    return pairs + ("; " + ", ".join(others) if others else "")

  return (f"Learning rates chosen by {criterion} (the tuning seeds' mean AUC / final J at each "
          "rate): " + "; ".join(f"{arm} {t['learning_rate']:g} ({described(t)})"
                                for arm, t in arms.items()))


def run_cell(study, regime: str, group_size: int, tuned: dict, runners: dict,
             path: pathlib.Path) -> dict:
  """Trains every arm of a (regime, G) cell on the reported seeds at its chosen learning
  rate (`tune`); runs already in `path` are read back (more seeds extend a cell: a run does
  not depend on the others). Returns {"arms": {arm: {"curves": {seed: curve},
  "learning_rate"}}, "seconds", "compile_seconds", "spans", "signature"}, the curves of
  the study's seeds only."""
  cell = cell_of(study, regime, group_size)
  rates = {arm: tuned["arms"][arm]["learning_rate"] for arm in study.arms}
  expected = signature(cell, study.seeds)
  written, _ = _piece_arms(study, path, expected, grows_by_seed=True)
  stored = written.get("arms", {})
  moved = [arm for arm in study.arms if arm in stored and stored[arm]["learning_rate"]
           != rates[arm]]
  if moved:
    raise ValueError(f"{path} holds {', '.join(moved)} at other learning rates than the "
                     "tuning's; move it away to rerun the cell.")
  missing = [(arm, seed) for arm in study.arms for seed in study.seeds
             if str(seed) not in stored.get(arm, {}).get("curves", {})]
  if missing:
    arms = list(study.arms)
    print(f"[sweep] {regime} G={group_size}: {len(missing)} runs of "
          f"{len(dict.fromkeys(a for a, _ in missing))} arms, {cell.updates} updates", flush=True)
    runs = [(arms.index(arm), rates[arm], seed) for arm, seed in missing]
    reported = train_in_programs(study, _runner(cell, runners), runs)
    new = {arm: {"curves": dict(stored.get(arm, {}).get("curves", {})),
                 "learning_rate": rates[arm], **arm_settings(study, arm)}
           for arm, _ in missing}
    for row, (a, _, seed) in enumerate(runs):
      new[arms[a]]["curves"][str(seed)] = run_curve(reported, row)
    seeds = {int(s) for r in (*stored.values(), *new.values()) for s in r["curves"]}
    written = _write_piece(path, written, new, {**expected, "seeds": sorted(seeds)}, reported,
                           study.preset)
  asked = {str(seed) for seed in study.seeds}
  return {**written, "arms": {
      arm: {**r, "curves": {s: c for s, c in r["curves"].items() if s in asked}}
      for arm, r in written["arms"].items()}}


def _pin(cores) -> None:
  """A worker's initialiser: run on its own CPU cores (XLA's threads inherit them; where
  the OS cannot pin, e.g. macOS, the workers share the cores)."""
  share = cores.get()
  if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, share)


_WORKER_RUNNERS: dict[str, dict] = {}  # in a worker: regime -> {G: Runner}


def _piece(study, workdir: pathlib.Path, regime: str, group_size: int | None) -> None:
  """One piece of the sweep in a worker: the regime's tuning (read back when done), then the
  (regime, G) cell unless `group_size` is None."""
  runners = _WORKER_RUNNERS.setdefault(regime, {})
  rates = tune(study, regime, runners, workdir / "cells" / regime / "tuning.json")
  if group_size is not None:
    run_cell(study, regime, group_size, rates, runners,
             workdir / "cells" / regime / f"G{group_size}.json")


def _run_in_workers(study, workdir: pathlib.Path, regimes: list[str]) -> None:
  """The pieces in `study.workers` processes, each pinned to its share of this process's
  CPU cores: on a CPU, independent programs side by side use the cores better than one
  program's threads (small ops leave them idle). A regime's cells start once its tuning is
  written. A piece that fails does not stop the others: the failures are raised together
  once every other piece is written."""
  cores = sorted(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity")
                 else range(os.cpu_count() or 1))
  if study.workers > len(cores):
    raise ValueError(f"workers ({study.workers}) must be at most the CPU cores available "
                     f"({len(cores)}).")
  context = multiprocessing.get_context("spawn")  # no fork of a process that runs XLA
  shares = context.Queue()
  for i in range(study.workers):
    shares.put(set(cores[i::study.workers]))
  failed = []

  def settled(future, piece: str) -> bool:
    error = future.exception()
    if error is not None:  # the other pieces go on and are written
      failed.append(f"{piece}: {error!r}")
    return error is None

  with futures.ProcessPoolExecutor(study.workers, mp_context=context, initializer=_pin,
                                   initargs=(shares,)) as pool:
    tunings = {pool.submit(_piece, study, workdir, regime, None): regime for regime in regimes}
    cells = {}
    for done in futures.as_completed(tunings):
      if settled(done, f"{tunings[done]} tuning"):
        regime = tunings[done]
        cells.update({pool.submit(_piece, study, workdir, regime, g): f"{regime} G={g}"
                      for g in study.group_sizes})
    for done in futures.as_completed(cells):
      settled(done, cells[done])
  if failed:
    raise RuntimeError("Pieces of the sweep failed (the others are written; a rerun resumes "
                       "them): " + "; ".join(failed))


def regimes_to_run(study) -> list[str]:
  """study.run_regimes (None: every regime of study.regimes); an unknown name is refused."""
  regimes = list(study.get("run_regimes") or study.regimes)
  unknown = [regime for regime in regimes if regime not in study.regimes]
  if unknown:
    raise ValueError(f"Unknown regime {unknown[0]!r} in run_regimes; known: "
                     f"{', '.join(study.regimes)}.")
  return regimes


def regimes_not_run(study, done) -> str | None:
  """The report's sentence naming the regimes of `study` not in `done`; None if all ran."""
  missing = [regime for regime in study.regimes if regime not in done]
  return (f"Regimes of the preset not run here: {', '.join(missing)} (`run_regimes`)."
          if missing else None)


def run(study, workdir: str) -> dict:
  """Runs (or resumes) every (regime, G, arm) and writes the report; returns the summaries.
  With `study.workers` > 1 the pieces run in that many processes (`_run_in_workers`)."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "sweep_config.json").write_text(study.to_json_best_effort(indent=2))
  regimes = regimes_to_run(study)  # before any training
  if study.get("workers", 1) > 1:
    _run_in_workers(study, workdir, regimes)  # then read back below
  results, tuned = {}, {}
  for regime in regimes:
    runners = {}  # G -> the compiled program of this regime's cells
    tuned[regime] = tune(study, regime, runners, workdir / "cells" / regime / "tuning.json")
    results[regime] = {
        g: run_cell(study, regime, g, tuned[regime], runners,
                    workdir / "cells" / regime / f"G{g}.json") for g in study.group_sizes}
  summaries = write_report(study, workdir, results, tuned)
  print(f"[sweep] wrote {workdir / 'report.md'}", flush=True)
  return summaries


def commit() -> str:
  """The git commit of this checkout (with "+changes" when it has uncommitted ones)."""
  root = pathlib.Path(__file__).resolve().parents[2]
  git = lambda *args: subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                     check=False).stdout.strip()
  head = git("rev-parse", "--short", "HEAD")
  return "commit unknown" if not head else head + (
      "+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def charge_flops(cell: cells.Cell, names: list, curves: dict) -> dict:
  """`curves` ({arm: {seed: curve}}) with "charged_flops" added to the runs that did not
  record them (cells run before runs did) where the charge does not depend on the samples
  (`compute.fixed_update_flops`: the updates so far times the arm's FLOPs per update);
  `names` are the study's arms, in the order of the cell's."""
  charged, specs = {}, dict(zip(names, cell.arms))
  for arm, runs in curves.items():
    per_update = compute.fixed_update_flops(cell, specs[arm])
    charged[arm] = {seed: curve if "charged_flops" in curve or per_update is None else
                    {**curve, "charged_flops": [per_update * u for u in curve["updates"]]}
                    for seed, curve in runs.items()}
  return charged


def write_report(study, workdir: pathlib.Path, results: dict, tuned: dict) -> dict:
  rng = np.random.default_rng(0)
  timed = [*tuned.values(), *(cell for by_g in results.values() for cell in by_g.values())]
  seconds = sum(part["seconds"] for part in timed)
  compile_seconds = sum(part["compile_seconds"] for part in timed)
  busy = tables.busy_seconds([span for part in timed for span in part["spans"]])
  lines = [
      f"# Credit sweep: {study.preset} preset", "",
      f"Regimes × G ∈ {list(study.group_sizes)} × {len(study.arms)} arms; "
      f"{study.prompts_per_step} prompts per update; reported seeds {list(study.seeds)}, "
      f"learning rate per arm and regime from {list(study.learning_rates)} by "
      + ("mean AUC" if (study.get("tuning_criterion") or "auc") == "auc"
         else "mean AUC + mean final J") + " at "
      f"G = {study.tuning_group_size} on seeds {list(study.tuning_seeds)} (excluded from "
      "every number below). Advantages are "
      "RMS-scaled; one PPO-clip step per batch (a plain policy gradient). J(π): exact "
      "expected success over the evaluation prompts. Paired differences from GRPO by seed: "
      "95% BCa bootstrap intervals (n/a below 5 seeds), sign-flip permutation p-values and "
      f"sign-flip TOST at ±{study.margin}, each Holm-adjusted across the arms of a cell. "
      f"Verdicts at α = {tables.VERDICT_ALPHA}: higher or lower when significant and at least "
      "the margin, negligible when shown inside it, ceiling when both arms' final J is at "
      f"least {tables.CEILING}, else inconclusive; these are per cell, exploratory (the "
      "corrected verdicts across cells are `studies.credit_study.verdicts`'). "
      f"Wall time {seconds:.0f} s summed over the pieces "
      f"(tuning and cells; {compile_seconds:.0f} s of it compiling), "
      f"{study.get('workers', 1)} at a time: {busy / 60:.0f} min while pieces ran (the union "
      "of their spans: the pauses of a resumed sweep are not counted), on "
      f"{report.machine()}; jaxcredit {commit()}.", ""]
  not_run = regimes_not_run(study, results)
  if not_run:
    lines += [not_run, ""]
  summaries, all_curves = {}, {}
  for regime, by_g in results.items():
    spec = study.regimes[regime]
    lines += [f"## Regime `{regime}`: {regime_task(study, regime)} {dict(spec.task)}"
              + (f", warm start {dict(spec.warmup)}" if spec.get("warmup") else "")
              + (f", policy {dict(spec.model_overrides)}" if spec.get("model_overrides") else "")
              + (f", {spec.prompts_per_step} prompts per update"
                 if spec.get("prompts_per_step") else ""), ""]
    entropy = tables.filler_entropy(by_g)
    lines += ([entropy, ""] if entropy else []) + [
              tuning_line(study, tuned[regime]), ""]
    for g, cell in by_g.items():
      by_arm = {arm: cell["arms"][arm] for arm in study.arms}
      curves = charge_flops(cell_of(study, regime, g), list(study.arms), {
          arm: {int(s): c for s, c in r["curves"].items()} for arm, r in by_arm.items()})
      summary, bounds = report.summarise(curves, final_share=tables.FINAL_SHARE)
      summaries.setdefault(regime, {})[g] = summary
      all_curves.setdefault(regime, {})[g] = curves
      # The cell's budget: every run's on key_token; on target_sum the most any run took
      # (each run's own count is in the efficiency table).
      tokens = int(max(c["gen_tokens"][-1] for runs in curves.values() for c in runs.values()))
      lines += [f"### G = {g} ({tokens:,} generated tokens per run"
                + (", at most)" if regime_task(study, regime) == "target_sum" else ")"), ""]
      if "grpo" in summary:
        lines += [tables.budget_check(summary, bounds["level"], tokens), ""]
      lines += report.efficiency_table(summary, bounds["level"], rng, 10000)
      for metric in ("final", "auc"):
        if "grpo" in summary:
          comparisons = tables.compare(summary, metric, study.margin, rng)
          lines += [""] + tables.comparison_table(comparisons, metric)
      charged = tables.charged_table(curves, tokens, rng)
      lines += [""] + charged if charged else []
      matched = tables.flops_table(curves, rng)
      lines += [""] + matched if matched else []
      keys = tables.key_table(curves, summary)
      if keys and "grpo" in summary:
        lines += ["", *tables.STALL_HEADER, *tables.stall_rows(regime, g, summary)]
      lines += [""] + keys if keys else []
      lines += [""] + tables.mechanism_table(curves)
      ranks = tables.ranking_table(curves)
      lines += [""] + ranks if ranks else []
      lines += [""] + report.learning_curves(workdir, f"{regime}_G{g}", curves) + [""]
      if charged:
        lines += report.learning_curves(workdir, f"{regime}_G{g}", curves, charged=True) + [""]
  table, slopes, rows = tables.localisation(summaries, all_curves, rng)
  lines += ["## Localisation gain against G and GRPO's gradient noise", ""] + table + [""]
  for (group, metric, name), (slope, low, high) in slopes.items():
    lines.append(f"- `{group}`: slope of Δ_loc ({metric}) on {name} = {slope:+.3f} "
                 f"[{low:+.3f}, {high:+.3f}] (OLS over runs, 95% bootstrap).")
  lines += [""] + tables.localisation_figure(workdir, rows, rng)
  lines += ["", "## The mechanism's prediction for the learning curves, checked", ""]
  lines += tables.alignment_check(summaries, all_curves)
  (workdir / "report.md").write_text("\n".join(lines) + "\n")
  return summaries
