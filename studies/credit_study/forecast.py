"""The mechanism as a forecast, committed before the runs it predicts.

  python -m studies.credit_study.forecast \\
      --config studies/credit_study/configs.py:forecast --workdir DIR

Nothing is trained. For each cell of the forecast grid (filler regime x reward rule x
starting success p0 x G, the `forecast` preset's regimes) and each seed, on the policy the
cell's runs start from (`batched.starting_policy`: the regime's SFT, its keys right as often
as p0 needs) and on the same regime's policy at J = 1/2 (the same SFT with the keys right as
often as J = 1/2 needs under the rule), each arm's gradient is measured over
`forecast.batches` fresh batches, one ascent per group (`gradients.group_gradients`):

  B_noise    tr S / |E g|^2 over the groups (`gradients.gradient_noise`)
  cos        of E g with the true gradient of J, in closed form (`gradients.success_gradient`)
  |grad J|   the true gradient's norm
  P_zero     the chance that a group's rewards are all equal (`zero_variance_probability`)

The forecast. Adam moves every parameter by about the same amount whatever the gradient's
scale, so an update of B groups along an estimate whose expectation makes angle cos with
grad J, and whose noise is B_noise / B of its signal, moves J by about

  dJ/du = c s(J),   s = |grad J| cos / sqrt(1 + B_noise / B)

(the first-order gain of a normalised step along the noisy mean). Per seed (each run starts
from its own policy), s is interpolated linearly in J between the seed's two measured points
and held beyond them; its updates to the threshold are the integral of dJ / (c s(J)) from the
start's J to `forecast.threshold` (never when s <= 0 on the way). A cell's runs get three
times GRPO's median over seeds (`budget_updates`), and what they are predicted to measure is
each arm's restricted mean over seeds (a seed's updates, at most the budget), the outcome's
own measure; tokens are updates times the cell's tokens per update. An arm's speed-up over
GRPO is the ratio of their restricted means. c is fitted once, on a committed cell
(`forecast.calibration`: every arm at the same rate, J from exact evaluations): the geometric
mean over its arms of predicted (median over seeds) over measured updates to the threshold.

DIR/points/<filler>_<rule>/G<g>.json holds the measurements (each written once, atomically,
and refused when written under other settings); DIR/forecast.json and DIR/forecast.md the
forecast, its held-out cells and the criterion the runs are scored by.
"""

import dataclasses
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats
from flax import nnx

from jaxcredit import estimators, losses
from jaxcredit.atomic import write_atomically
from jaxcredit.lab import arms, batched, cells, exact_metrics, gradients, update_batch
from jaxcredit.models import Transformer
from jaxcredit.tasks import key_token
from studies.credit_study import report, runner, sweep

MEASURED = ("success", "gradient_norm", "zero_variance", "trace", "signal", "noise_scale",
            "cosine_to_true", "projection")
GRID_POINTS = 400  # of the integral over J


def policy_graphdef(cell: cells.Cell):
  """The graph of the cell's policy, to merge with the stacked states of `warm_policies`."""
  return nnx.graphdef(nnx.eval_shape(lambda: Transformer(cell.model, rngs=nnx.Rngs(0))))


def warm_policies(cell: cells.Cell, accuracies, seeds):
  """The policies runs of `cell` start from, with its warmup's key accuracy set to each of
  `accuracies` [n], for each of `seeds` [m] (`batched.starting_policy`): their stacked
  ``nnx.State`` ``[n, m, ...]``; the cell's own start at every accuracy when it has no
  warmup."""
  def at(accuracy, seed):
    start = cell if cell.warmup is None else dataclasses.replace(
        cell, warmup=dataclasses.replace(cell.warmup, key_accuracy=accuracy))
    return nnx.state(batched.starting_policy(start, seed))

  return jax.jit(jax.vmap(jax.vmap(at, in_axes=(None, 0)), in_axes=(0, None)))(
      jnp.asarray(accuracies, jnp.float32), jnp.asarray(seeds, jnp.int32))


def measure_fn(cell: cells.Cell, batches: int):
  """``measure(states [n, m], seeds [m]) -> {name in MEASURED: [n, m] or [n, m, arms]}``,
  jitted: for each policy (`warm_policies`) its J, the true gradient's norm, P_zero, and per
  arm of the cell `gradients.gradient_noise` over `batches` x prompts_per_step groups (the
  same batches for every arm, drawn from the seed's mechanism stream)."""
  task = update_batch.traceable_task(cell)
  config, actions = cell.task, task.actions
  prompts, targets = task.eval_prompts
  branches = [estimators.from_config(arm) for arm in cell.arms]
  objective = losses.from_config(cell.objective)
  rollout = update_batch.make_rollout(cell, arms.needs(branches))
  graphdef = policy_graphdef(cell)

  def at(state, seed):
    model = nnx.merge(graphdef, state)
    success, true_gradient = gradients.success_gradient(model, config, prompts, targets)
    zero_variance = jnp.mean(gradients.zero_variance_probability(
        model, config, prompts, targets, cell.group_size))

    def on_batch(state, key):
      model = nnx.merge(graphdef, state)
      batch = rollout(model, key)
      credits = jnp.stack([branch(batch).advantages for branch in branches])
      return state, -gradients.group_gradients(objective, model, batch, credits, actions)

    keys = jax.random.split(jax.random.fold_in(jax.random.key(seed), update_batch.MECHANISM_STREAM),
                            batches)
    _, ascents = jax.lax.scan(on_batch, state, keys)  # [R, arms, groups, P]
    ascents = jnp.moveaxis(ascents, 1, 0).reshape(len(branches), -1, ascents.shape[-1])
    noise = jax.vmap(gradients.gradient_noise, in_axes=(0, None))(ascents, true_gradient)
    return {"success": success, "gradient_norm": jnp.linalg.norm(true_gradient),
            "zero_variance": zero_variance, **noise}

  return jax.jit(jax.vmap(jax.vmap(at), in_axes=(0, None)))


def efficiency(point: dict, prompts_per_step: int) -> np.ndarray:
  """s = |grad J| cos / sqrt(1 + B_noise / B) per seed and arm ``[m, arms]`` of one measured
  point (its lists ``[m]`` and ``[m, arms]``), computed as its equal
  ``projection / sqrt(signal + trace / B)`` times |grad J|, which stays measurable where
  the signal is too weak for the noise scale and the cosine to be."""
  norm = np.asarray(point["gradient_norm"], np.float64)[:, None]
  step = np.sqrt(np.asarray(point["signal"], np.float64)
                 + np.asarray(point["trace"], np.float64) / prompts_per_step)
  return norm * np.asarray(point["projection"], np.float64) / np.where(step > 0, step, np.inf)


def updates_to(threshold: float, points: list[dict], prompts_per_step: int) -> np.ndarray:
  """Per arm, the integral of dJ / s(J) from the first point's J to `threshold` (c = 1): s
  the mean over seeds at each point, linear in J between the points (sorted by J) and held
  beyond them; inf for an arm whose s is not positive on the way; 0 when J starts there."""
  start = float(np.mean(points[0]["success"]))
  at = sorted(((float(np.mean(p["success"])), efficiency(p, prompts_per_step).mean(0))
               for p in points), key=lambda point: point[0])
  if start >= threshold:
    return np.zeros(len(at[0][1]))
  grid = np.linspace(start, threshold, GRID_POINTS)
  js = np.asarray([j for j, _ in at])
  out = []
  for arm in range(len(at[0][1])):
    s = np.interp(grid, js, [e[arm] for _, e in at])
    out.append(np.trapezoid(1 / s, grid) if np.all(s > 0) else np.inf)
  return np.asarray(out)


def per_seed_updates(threshold: float, points: list[dict], prompts_per_step: int) -> np.ndarray:
  """`updates_to` of each seed's own points ``[m, arms]``: one integral per starting
  policy (each point's lists hold the seeds in one order)."""
  seeds = len(points[0]["success"])
  return np.stack([updates_to(threshold, [{k: v[i:i + 1] for k, v in p.items()} for p in points],
                              prompts_per_step) for i in range(seeds)])


def predicted_outcome(per_seed: np.ndarray, grpo: int, budget_range) -> dict:
  """What a cell's runs are predicted to measure, from the predicted updates per seed and
  arm ``[m, arms]``: the budget (`budget_updates` of GRPO's median over seeds) and per arm
  the restricted mean (each seed's updates, at most the budget: the outcome's own measure)
  and the share of seeds predicted to reach the threshold within the budget."""
  budget = budget_updates(float(np.median(per_seed[:, grpo])), *budget_range)
  return {"budget": budget, "updates": np.minimum(per_seed, budget).mean(axis=0),
          "reached": np.mean(per_seed <= budget, axis=0)}


def restricted_mean(curves: dict, threshold: float) -> float:
  """The mean over runs of the updates to `threshold`, a run that never reaches it counted
  at its last update (every run censored at the same budget: the restricted mean time, with
  no survivor bias)."""
  times = [exact_metrics.tokens_to_reach(c["updates"], c["success"], threshold, log_scale=False)
           for c in curves.values()]
  budget = [c["updates"][-1] for c in curves.values()]
  return float(np.mean([t if t is not None else b for t, b in zip(times, budget)]))


def success_under(states, config: key_token.KeyTokenConfig, cell: cells.Cell) -> np.ndarray:
  """Exact J under `config`'s rule of each stacked policy ``[n, m]``."""
  task = update_batch.traceable_task(cell)
  graphdef = policy_graphdef(cell)
  j = lambda state: jnp.mean(key_token.oracle.decisive_values(
      nnx.merge(graphdef, state), config, *task.eval_prompts)[0][:, 0])
  return np.asarray(jax.jit(jax.vmap(jax.vmap(j)))(states), np.float64)


def filler_cell(study, filler: str, rule: str, group_size: int) -> cells.Cell:
  """The (filler, rule) regime's cell at G, with no gradient measurements of its own."""
  cell = sweep.cell_of(study, f"{filler}_{rule}", group_size)
  return dataclasses.replace(cell, mechanism_batches=0, mechanism_evals=None)


def choose_accuracies(study, filler: str) -> dict:
  """The SFT key accuracies of a filler regime: J under both rules after the SFT at each of
  `forecast.calibration_accuracies` (the first two seeds), and by linear interpolation the
  accuracy for each starting success p0 (J under rule all: every key right) and for J =
  `forecast.half_success` under each rule; 1 where J stays below the target."""
  cell = filler_cell(study, filler, "all", study.group_sizes[0])
  grid = list(study.forecast.calibration_accuracies)
  states = warm_policies(cell, grid, list(study.seeds)[:2])
  measured = {rule: success_under(states, dataclasses.replace(cell.task, rule=rule), cell)
              .mean(axis=1) for rule in study.forecast.rules}
  def accuracy(rule, target):
    j = np.maximum.accumulate(measured[rule])
    return 1.0 if target > j[-1] else float(np.interp(target, j, grid))
  chosen = {point_name(p0): accuracy("all", p0) for p0 in study.forecast.start_success}
  for rule in study.forecast.rules:
    chosen[f"half_{rule}"] = accuracy(rule, study.forecast.half_success)
  return {"grid": grid, **{f"J_{rule}": j.tolist() for rule, j in measured.items()},
          "chosen": chosen}


def point_name(p0: float) -> str:
  """p0's name in regime and cell names: 1/16 -> "p1_16", 0.3 -> "p0_3"."""
  inverse = 1 / p0
  if p0 < 0.5 and np.isclose(inverse, round(inverse)) and not np.isclose(p0, round(p0, 1)):
    return f"p1_{round(inverse)}"
  return f"p{p0:g}".replace(".", "_")


def measure(study, workdir: pathlib.Path) -> dict:
  """Every (filler, rule, G) group of points not yet written (module docstring): DIR/points/
  <filler>_<rule>/G<g>.json {"signature", "points": {name: {measure: lists}}, "seconds"};
  and the chosen accuracies, DIR/accuracies.json. Returns {(filler, rule, G): points}."""
  accuracies_path = workdir / "accuracies.json"
  chosen = json.loads(accuracies_path.read_text()) if accuracies_path.exists() else {}
  out = {}
  for filler in study.forecast.fillers:
    if filler not in chosen:
      print(f"[forecast] {filler}: choosing the SFT's key accuracies", flush=True)
      chosen[filler] = choose_accuracies(study, filler)
      write_atomically(accuracies_path, lambda tmp: tmp.write_text(json.dumps(chosen, indent=1)))
    names = list(chosen[filler]["chosen"])
    states = None
    for rule in study.forecast.rules:
      for g in study.group_sizes:
        cell = filler_cell(study, filler, rule, g)
        path = workdir / "points" / f"{filler}_{rule}" / f"G{g}.json"
        expected = {**sweep.signature(cell, list(study.seeds)),
                    "accuracies": chosen[filler]["chosen"], "batches": study.forecast.batches}
        if path.exists():
          stored = json.loads(path.read_text())
          sweep.refuse_other_settings(path, stored.get("signature"), expected)
        else:
          print(f"[forecast] {filler} {rule} G={g}", flush=True)
          begin = time.time()
          if states is None:
            states = warm_policies(cell, [chosen[filler]["chosen"][n] for n in names],
                                   list(study.seeds))
          measured = measure_fn(cell, study.forecast.batches)(states, jnp.asarray(study.seeds))
          stored = {"signature": expected, "seconds": time.time() - begin, "points": {
              name: {k: np.asarray(v[i]).tolist() for k, v in measured.items()}
              for i, name in enumerate(names)}}
          path.parent.mkdir(parents=True, exist_ok=True)
          write_atomically(path, lambda tmp: tmp.write_text(json.dumps(stored)))
        out[filler, rule, g] = stored
  return out


def calibrate(study, workdir: pathlib.Path, points: dict) -> dict:
  """c, from the committed cell `forecast.calibration` (uniform filler from the random
  policy, rule all, every arm at one rate): its start measured here (DIR/points/
  calibration.json), its J = 1/2 point the uniform_sft regime's (the same cell but for the
  SFT); c is the geometric mean over the committed cell's arms of predicted (c = 1, the
  median over seeds)
  over measured updates to the threshold (`restricted_mean`)."""
  committed = json.loads(pathlib.Path(study.forecast.calibration).read_text())
  group_size = committed["signature"]["cell"]["group_size"]
  cell = dataclasses.replace(filler_cell(study, "uniform_sft", "all", group_size), warmup=None)
  expected = sweep.signature(cell, [])["cell"]
  for field in ("task", "model", "group_size", "prompts_per_step", "objective"):
    if committed["signature"]["cell"][field] != expected[field]:
      raise ValueError(f"The calibration cell's {field} is not the forecast's: "
                       f"{committed['signature']['cell'][field]} != {expected[field]}.")
  path = workdir / "points" / "calibration.json"
  if path.exists():
    start = json.loads(path.read_text())
  else:
    states = warm_policies(cell, [0.0], list(study.seeds))
    measured = measure_fn(cell, study.forecast.batches)(states, jnp.asarray(study.seeds))
    start = {k: np.asarray(v[0]).tolist() for k, v in measured.items()}
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(start)))
  half = points["uniform_sft", "all", group_size]["points"]["half_all"]
  predicted = np.median(per_seed_updates(study.forecast.threshold, [start, half],
                                         cell.prompts_per_step), axis=0)
  names = list(study.arms)
  rows = {arm: {"predicted": float(predicted[names.index(arm)]),
                "measured": restricted_mean(committed["arms"][arm]["curves"],
                                            study.forecast.threshold)}
          for arm in committed["arms"]}
  fitted = [np.log(r["predicted"] / r["measured"]) for r in rows.values()
            if np.isfinite(r["predicted"]) and r["predicted"] > 0 and r["measured"] > 0]
  if not fitted:
    raise ValueError(f"c cannot be fitted: no arm of {study.forecast.calibration} is predicted "
                     f"to reach J = {study.forecast.threshold} in finite updates ({rows}).")
  return {"c": float(np.exp(np.mean(fitted))), "arms": rows, "cell": study.forecast.calibration}


def predict(study, points: dict, c: float) -> dict:
  """{cell name: the forecast} for every (filler, rule, p0, G): J and P_zero at the start
  (means over seeds), the training budget the cell's runs get, and per arm the predicted
  restricted mean updates and tokens to the threshold, the share of seeds predicted to
  reach it, and the speed-up over GRPO (`predicted_outcome`)."""
  names, threshold = list(study.arms), study.forecast.threshold
  out = {}
  for (filler, rule, g), stored in points.items():
    for p0 in study.forecast.start_success:
      start = stored["points"][point_name(p0)]
      half = stored["points"][f"half_{rule}"]
      outcome = predicted_outcome(
          per_seed_updates(threshold, [start, half], study.prompts_per_step) / c,
          names.index("grpo"), study.forecast.budget_range)
      updates, grpo = outcome["updates"], outcome["updates"][names.index("grpo")]
      tokens_per_update = (study.prompts_per_step * g
                           * study.regimes[f"{filler}_{rule}"].task.length)
      out[f"{filler}_{rule}_{point_name(p0)}_G{g}"] = {
          "filler": filler, "rule": rule, "p0": p0, "group_size": g,
          "start_success": float(np.mean(start["success"])),
          "half_success": float(np.mean(half["success"])),
          "zero_variance": float(np.mean(start["zero_variance"])),
          "updates": {a: float(u) for a, u in zip(names, updates)},
          "reached": {a: float(r) for a, r in zip(names, outcome["reached"])},
          "tokens": {a: float(u * tokens_per_update) for a, u in zip(names, updates)},
          "speedup": {a: speedup(grpo, u) for a, u in zip(names, updates)},
          "budget_updates": outcome["budget"]}
  return out


def speedup(grpo_updates: float, updates: float) -> float | None:
  """GRPO's updates over an arm's: +inf when only the arm reaches the threshold (JSON
  Infinity), 0 when only GRPO does, None when neither does, 1 when both start there."""
  if np.isinf(grpo_updates) and np.isinf(updates):
    return None
  if updates == 0:
    return 1.0 if grpo_updates == 0 else float("inf")
  return float(grpo_updates / updates)


def budget_updates(grpo_updates: float, low: int = 100, high: int = 1000) -> int:
  """The updates a forecast cell's runs get: three times GRPO's predicted updates to the
  threshold, in [low, high], a multiple of 10."""
  if not np.isfinite(grpo_updates):
    return high
  return int(np.clip(10 * np.ceil(3 * grpo_updates / 10), low, high))


CRITERION = (
    "The forecast passes if, over the held-out cells (drawn below before any of them is "
    "trained, each trained from the measured starting policies), the predicted "
    "exact-credit speed-up over GRPO (`speedup.oracle`, the ratio of predicted updates to "
    "J = {threshold}) ranks the measured one with Spearman rho >= 0.7. The measured "
    "speed-up is GRPO's restricted mean updates to the threshold over the oracle's (mean "
    "over seeds of the first update reaching it, linear between evaluations, a run that "
    "never does counted at its budget). A cell predicted with only the arm reaching the "
    "threshold ranks above every other; one with neither is left out. Secondary, reported "
    "whatever they show: the same for each other arm's speed-up; the rival, "
    "mechanism-free predictor (the start's P_zero) ranked the same way; the predicted "
    "updates against the measured ones (log ratio).")


def held_out(cells_out: dict, count: int, seed: int = 0) -> list[str]:
  """`count` cells drawn uniformly without replacement (a fixed draw), in training order:
  the cheapest first (budget x G, the generated tokens)."""
  names = sorted(cells_out)
  drawn = np.random.default_rng(seed).choice(len(names), size=min(count, len(names)),
                                             replace=False)
  cost = lambda n: (cells_out[n]["budget_updates"] * cells_out[n]["group_size"], n)
  return sorted((names[i] for i in drawn), key=cost)


def run(study, workdir: str) -> dict:
  """`forecast.stage`: "forecast" measures what is missing, calibrates c and writes
  DIR/forecast.json and forecast.md (the held-out cells included); "train" trains the
  held-out cells of DIR/forecast.json not yet trained (`train`); "score" writes DIR/score.md
  from the cells trained (`score`). Returns what the stage wrote."""
  workdir = pathlib.Path(workdir)
  stage = study.forecast.get("stage", "forecast")
  if stage == "train":
    return train(study, workdir)
  if stage == "score":
    return score(study, workdir)
  if stage != "forecast":
    raise ValueError(f"Unknown forecast.stage {stage!r}; known: forecast, train, score.")
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "study_config.json").write_text(study.to_json_best_effort(indent=2))
  points = measure(study, workdir)
  calibration = calibrate(study, workdir, points)
  cells_out = predict(study, points, calibration["c"])
  order = sorted(cells_out, key=lambda n: (cells_out[n]["group_size"], n))
  forecast = {"commit": sweep.commit(), "written": time.strftime("%Y-%m-%d"),
              "machine": report.machine(), "threshold": study.forecast.threshold,
              "arms": dict(study.arms.to_dict()), "calibration": calibration,
              "criterion": CRITERION.format(threshold=study.forecast.threshold),
              "held_out": held_out(cells_out, study.forecast.held_out),
              "training_seeds": list(study.forecast.training_seeds),
              "cells_in_order": order, "cells": cells_out,
              "measure_seconds": sum(p["seconds"] for p in points.values())}
  (workdir / "forecast.json").write_text(json.dumps(forecast, indent=1))
  (workdir / "forecast.md").write_text(write_report(study, forecast, workdir))
  print(f"[forecast] wrote {workdir / 'forecast.md'}", flush=True)
  return forecast


def training_cell(study, accuracies: dict, spec: dict) -> cells.Cell:
  """A forecast cell as trained: the (filler, rule) regime at G with the SFT's key accuracy
  chosen for its p0 (the measured starting policies), its budget's updates, J at
  `eval_points` log-spaced updates."""
  cell = filler_cell(study, spec["filler"], spec["rule"], spec["group_size"])
  accuracy = accuracies[spec["filler"]]["chosen"][point_name(spec["p0"])]
  updates = spec["budget_updates"]
  return dataclasses.replace(
      cell, warmup=dataclasses.replace(cell.warmup, key_accuracy=accuracy), updates=updates,
      eval_every=updates, eval_at=sweep.log_spaced(updates, study.eval_points))


def train(study, workdir: pathlib.Path) -> dict:
  """Trains each held-out cell of DIR/forecast.json not yet in DIR/runs/ (every arm at the
  study's one rate, the forecast's training seeds, in one program), in its order; writes
  DIR/runs/<cell>.json {"curves": {arm: {seed: curve}}, "seconds"} atomically. Returns
  {cell: seconds} of those trained now."""
  forecast = json.loads((workdir / "forecast.json").read_text())
  accuracies = json.loads((workdir / "accuracies.json").read_text())
  (rate,) = set(study.fixed_learning_rates.values())
  names, trained = list(study.arms), {}
  for name in forecast["held_out"]:
    path = workdir / "runs" / f"{name}.json"
    if path.exists():
      continue
    print(f"[forecast] training {name}", flush=True)
    begin = time.time()
    runs = [(a, rate, seed) for a in range(len(names)) for seed in forecast["training_seeds"]]
    cell = training_cell(study, accuracies, forecast["cells"][name])
    result = batched.Runner(cell).train(runs)
    curves = {}
    for row, (a, _, seed) in enumerate(runs):
      curve = sweep.run_curve(result, row)
      curves.setdefault(names[a], {})[str(seed)] = {k: curve[k] for k in (
          "updates", "success", "gen_tokens", "zero_variance_groups")}
    stored = {"curves": curves, "seconds": time.time() - begin}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(stored)))
    trained[name] = stored["seconds"]
  return trained


def spearman(x, y) -> float | None:
  """Spearman's rho of two sequences over the pairs without NaN (average ranks for ties, inf
  ranks last); None with fewer than 3 pairs."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  kept = ~(np.isnan(x) | np.isnan(y))
  return float(scipy.stats.spearmanr(x[kept], y[kept]).statistic) if kept.sum() >= 3 else None


def score(study, workdir: pathlib.Path) -> dict:
  """The forecast against the trained held-out cells: per arm the Spearman rho of predicted
  and measured speed-ups over GRPO, the rival's (P_zero at the start) and the log ratio of
  predicted to measured updates; DIR/score.json. A predicted speed-up is +inf where only the
  arm reaches the threshold, and a cell where neither does is left out of that arm's
  ranking; a measured one with the arm's restricted mean 0 is +inf."""
  forecast = json.loads((workdir / "forecast.json").read_text())
  threshold, names = forecast["threshold"], list(forecast["arms"])
  trained = [n for n in forecast["held_out"] if (workdir / "runs" / f"{n}.json").exists()]
  measured, seconds = {}, 0.0
  for name in trained:
    run = json.loads((workdir / "runs" / f"{name}.json").read_text())
    curves, seconds = run["curves"], seconds + run.get("seconds", 0.0)
    means = {arm: restricted_mean(curves[arm], threshold) for arm in names}
    reached = {arm: float(np.mean([max(c["success"]) >= threshold
                                   for c in curves[arm].values()])) for arm in names}
    measured[name] = {"updates": means, "reached": reached, "speedup": {
        arm: means["grpo"] / means[arm] if means[arm] > 0 else np.inf for arm in names}}
  predicted = lambda n, arm: (forecast["cells"][n]["speedup"][arm]
                              if forecast["cells"][n]["speedup"][arm] is not None else np.nan)
  result = {"cells": trained, "complete": len(trained) == len(forecast["held_out"]),
            "rho": {}, "rival_rho": None, "log_ratio": {}}
  if len(trained) >= 3:
    for arm in (arm for arm in names if arm != "grpo"):
      result["rho"][arm] = spearman([predicted(n, arm) for n in trained],
                                    [measured[n]["speedup"][arm] for n in trained])
    result["rival_rho"] = spearman([forecast["cells"][n]["zero_variance"] for n in trained],
                                   [measured[n]["speedup"]["oracle"] for n in trained])
    for arm in names:
      ratios = [np.log(forecast["cells"][n]["updates"][arm] / measured[n]["updates"][arm])
                for n in trained if forecast["cells"][n]["updates"][arm]
                and measured[n]["updates"][arm] > 0]
      result["log_ratio"][arm] = float(np.mean(ratios)) if ratios else None
  result["passed"] = (result["complete"] and result["rho"].get("oracle") is not None
                      and result["rho"]["oracle"] >= 0.7)
  (workdir / "score.json").write_text(json.dumps({**result, "measured": measured}, indent=1,
                                                 default=float))
  (workdir / "score.md").write_text(write_score(forecast, result, measured, seconds))
  return result


def write_score(forecast: dict, result: dict, measured: dict, seconds: float) -> str:
  """score.md: the criterion's outcome, the secondary measures, and per held-out cell each
  arm's predicted and measured speed-up over GRPO, with GRPO's measured restricted mean and
  share of runs reaching the threshold."""
  names = list(forecast["arms"])
  others = [n for n in names if n != "grpo"]
  rho = lambda x: "n/a" if x is None else f"{x:+.2f}"
  verdict = ("passed" if result["passed"] else
             "failed" if result["complete"] else "not scored: held-out cells still untrained")
  lines = [
      "# The mechanism's forecast, scored", "",
      f"Against [forecast.md](forecast.md) (written at jaxcredit {forecast['commit']}, "
      "committed before any held-out cell was trained): "
      f"{len(result['cells'])} of {len(forecast['held_out'])} held-out cells trained "
      f"({seconds / 60:.0f} min of training on {report.machine()}; runs/ holds the curves).",
      "", "## Criterion", "", forecast["criterion"], "",
      f"**Spearman rho of the exact credit's predicted and measured speed-ups: "
      f"{rho(result['rho'].get('oracle'))}; the forecast {verdict}.**", "",
      "## Secondary", "",
      "| arm | Spearman rho of speed-ups | mean log(predicted / measured updates) |",
      "|---|---|---|",
      *[f"| {n} | {rho(result['rho'].get(n)) if n != 'grpo' else '—'} | "
        f"{rho(result['log_ratio'].get(n))} |" for n in names], "",
      f"The rival, mechanism-free predictor (the start's P_zero) ranks the exact credit's "
      f"measured speed-ups with rho {rho(result['rival_rho'])}.", "",
      "## By filler regime", "",
      "Mean over the regime's trained cells of the exact credit's speed-up, and of the share "
      "of runs that reach the threshold within the budget, predicted / measured.", "",
      "| filler | cells | oracle speed-up | GRPO reached | oracle reached |",
      "|---|---|---|---|---|"]
  pair = lambda predicted, measured: (f"{np.mean(predicted):.2f} / {np.mean(measured):.2f}"
                                      if predicted else "n/a")
  for filler in dict.fromkeys(forecast["cells"][n]["filler"] for n in result["cells"]):
    cells_in = [(forecast["cells"][n], measured[n]) for n in result["cells"]
                if forecast["cells"][n]["filler"] == filler]
    finite = [(c["speedup"]["oracle"], m["speedup"]["oracle"]) for c, m in cells_in
              if c["speedup"]["oracle"] is not None
              and np.isfinite([c["speedup"]["oracle"], m["speedup"]["oracle"]]).all()]
    reached = lambda arm: pair([c["reached"][arm] for c, _ in cells_in],
                               [m["reached"][arm] for _, m in cells_in])
    lines.append(f"| {filler} | {len(cells_in)} | {pair(*zip(*finite)) if finite else 'n/a'} | "
                 f"{reached('grpo')} | {reached('oracle')} |")
  lines += [
      "", "## Cells", "",
      "Speed-up: GRPO's restricted mean updates to the threshold over the arm's, predicted / "
      "measured (inf: only the arm arrives; never: neither does). Reached: the share of runs "
      "that reach the threshold within the budget, predicted / measured.", "",
      "| cell | budget | measured updates (GRPO) | GRPO reached | "
      + " | ".join(f"{n}: predicted / measured" for n in others) + " |",
      "|" + "---|" * (4 + len(others))]
  for name in result["cells"]:
    cell, outcome = forecast["cells"][name], measured[name]
    lines.append(
        f"| {name} | {cell['budget_updates']} | {outcome['updates']['grpo']:.0f} | "
        f"{cell['reached']['grpo']:.2f} / {outcome['reached']['grpo']:.2f} | "
        + " | ".join(f"{_num(cell['speedup'][n], '{:.2f}')} / {outcome['speedup'][n]:.2f}"
                     for n in others) + " |")
  return "\n".join(lines) + "\n"


def _num(x, fmt="{:.0f}") -> str:
  return "never" if x is None else fmt.format(x)


def write_report(study, forecast: dict, workdir: pathlib.Path) -> str:
  """forecast.md: the model, the calibration, the criterion, and per cell the measured start
  and the predictions."""
  accuracies = json.loads((workdir / "accuracies.json").read_text())
  names = list(study.arms)
  cal = forecast["calibration"]
  lines = [
      "# The mechanism's forecast, written before the runs it predicts", "",
      f"Written {forecast['written']} on {forecast['machine']}; jaxcredit "
      f"{forecast['commit']}; {forecast['measure_seconds'] / 60:.1f} min of measuring. "
      "Nothing here is trained: the model (`studies/credit_study/forecast.py`) turns "
      "gradient measurements on each cell's starting policy and on its regime's policy at "
      f"J = 1/2 into updates to J = {forecast['threshold']}. Seeds {list(study.seeds)}, "
      f"{study.forecast.batches} batches of {study.prompts_per_step} groups per "
      "measurement; arms " + ", ".join(f"`{n}`" for n in names) + ".", "",
      "## Criterion", "", forecast["criterion"], "",
      "## Calibration", "",
      f"c = {cal['c']:.4g}, from `{cal['cell']}`:", "",
      "| arm | predicted updates (c = 1) | measured (restricted mean) |", "|---|---|---|",
      *[f"| {a} | {r['predicted']:.4g} | {r['measured']:.1f} |" for a, r in cal["arms"].items()],
      "", "## The SFT's key accuracies", "",
      "| filler | accuracy grid | J (rule all) | J (rule count) | chosen |",
      "|---|---|---|---|---|",
      *[f"| {f} | {a['grid']} | {[round(j, 3) for j in a['J_all']]} | "
        f"{[round(j, 3) for j in a['J_count']]} | "
        f"{ {k: round(v, 3) for k, v in a['chosen'].items()} } |" for f, a in accuracies.items()],
      "", "## Predictions", "",
      "| cell | J start | J half | P_zero | budget | "
      + " | ".join(f"updates {n} (reached)" for n in names) + " | "
      + " | ".join(f"speed-up {n}" for n in names if n != "grpo") + " |",
      "|" + "---|" * (5 + 2 * len(names) - 1)]
  for name in forecast["cells_in_order"]:
    cell = forecast["cells"][name]
    lines.append(
        f"| {name} | {cell['start_success']:.3f} | {cell['half_success']:.3f} | "
        f"{cell['zero_variance']:.3f} | {cell['budget_updates']} | "
        + " | ".join(f"{cell['updates'][n]:.0f} ({cell['reached'][n]:.2f})" for n in names)
        + " | "
        + " | ".join(_num(cell["speedup"][n], "{:.2f}") for n in names if n != "grpo") + " |")
  lines += ["", f"Held out (trained in this order, seeds {forecast['training_seeds']}, "
            "every arm at the same rate; the criterion is scored on them): "
            + ", ".join(f"`{n}`" for n in forecast["held_out"]) + "."]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  runner.cli(run, "Forecast config (studies/credit_study/configs.py:forecast).")
