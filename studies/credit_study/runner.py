"""The credit study's entry point, and its first design: estimators x seeds trained on one
task, credit scored against the oracle.

  python -m studies.credit_study --config studies/credit_study/configs.py:small --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs_v1.py:small --workdir DIR

A config with `regimes` is the sweep (`sweep`: regimes x G x arms at equal tokens,
learning rates tuned, paired seeds vmapped in one program); a config with `tasks` is the
first design, below.

For every task, estimator and seed the study trains a policy with
`jaxcredit.train.loop.run` (same initialisation, prompts and evaluation per
seed; the rollouts or oracle values an estimator needs come from the extras
providers, `jaxcredit.credit.extras` and `lab.providers`) and measures its exact
expected success J(pi) and pass@k on held-out prompts (`lab.exact_metrics`). During the first
seed's GRPO run it scores every estimator's credit on the same batches
against the exact oracle (`lab.scores`) and checks Monte-Carlo values against
exact ones. Outputs in DIR: runs/<task>/<estimator>/seed<k>/ (each a training
workdir, resumable; wall_seconds.json marks it complete), scores.jsonl and
scores.csv, mc_check.jsonl, credit_dump_step<N>.npz, curves.json, report.md
and PNG figures. Rerunning with the same DIR resumes unfinished runs and
rewrites the report.
"""

import json
import pathlib
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from jaxcredit import estimators, forward, tasks
from jaxcredit.credit import extras, monte_carlo, rao_blackwell
from jaxcredit.lab import exact_metrics, scores
from jaxcredit.models import Transformer
from jaxcredit.rollout import Credit
from jaxcredit.sampling import generate
from jaxcredit.train import learner, loop
from studies.credit_study import report

# Offsets folded into the scoring key: every random draw of the scoring has its own stream.
CREDIT_STREAM, MC_CHECK_STREAM, RB_CHECK_STREAM = 1, 2, 3
RESAMPLE_STREAM, RESAMPLED_CREDIT_STREAM = 100, 200  # + the resample index


def _advantage(spec) -> dict | str:
  advantage = spec["advantage"]
  return advantage.to_dict() if hasattr(advantage, "to_dict") else advantage


def train_config(study, task: str, name: str, seed: int,
                 data_dir: str) -> ml_collections.ConfigDict:
  """The training config of one (task, estimator, seed) run."""
  spec = study.estimators[name]
  config = ml_collections.ConfigDict(study.tasks[task].train.to_dict())
  config.seed = seed
  config.task.data_dir = data_dir  # one dataset shared by every run
  advantage = _advantage(spec)
  config.advantage = {"scale": "rms", "of": advantage} if study.scale == "rms" else advantage
  if spec.get("critic", False):
    config.critic.preset = config.model.preset
  return config


def decisive_mask(task: tasks.TrainTask, shape) -> np.ndarray:
  """[B, L] bool: the task's decisive positions (key_token), else all False."""
  out = np.zeros(shape, bool)
  if task.name == "key_token":
    out[:, task.max_prompt_length + task.config.decisive_positions] = True
  return out


def monte_carlo_check(exact_values, mc: Credit, k: int, rng: np.random.Generator,
                      *, draws: int = 2000) -> dict:
  """Test T2 of Monte-Carlo values: calibration of V_hat against the exact V [B, T] on states
  with V in [0.05, 0.95]: X^2 = sum (k_s - K V)^2 / (K V (1 - V)) against its
  exact parametric-bootstrap null (Binomial(K, V))."""
  evaluated = np.asarray(mc.evaluated)
  v = np.asarray(exact_values, np.float64)[evaluated]
  v_hat = np.asarray(mc.values, np.float64)[evaluated]
  informative = (v >= 0.05) & (v <= 0.95)
  v, successes = v[informative], np.round(v_hat[informative] * k)
  statistic = lambda s: float(np.sum((s - k * v) ** 2 / (k * v * (1 - v))))
  observed = statistic(successes) if len(v) else 0.0
  null = np.array([statistic(rng.binomial(k, v)) for _ in range(draws)]) if len(v) else np.zeros(1)
  se = np.sqrt(v * (1 - v) / k)
  z = (successes / k - v) / se if len(v) else np.zeros(0)
  return {
      "states": int(len(v)),
      "k": k,
      "x2": observed,
      "x2_null_q999": float(np.quantile(null, 0.999)),
      "p_value": float(np.mean(null >= observed)),
      "mean_z": float(z.mean()) if len(z) else 0.0,
      "mean_z2": float((z**2).mean()) if len(z) else 0.0,
      "passes_t2": bool(observed <= np.quantile(null, 0.999))
  }


def rb_check(exact_advantages, rb: Credit, mask: np.ndarray) -> dict:
  """Test T3 for Rao-Blackwellised credit against the exact credit [B, T]:
  coverage of the 95% interval A_hat +- 1.96 SE, mean z^2 and mean error, over
  actions with SE > 1e-3."""
  error = (np.asarray(rb.advantages, np.float64) - np.asarray(exact_advantages, np.float64))[mask]
  se = np.asarray(rb.adv_stderr, np.float64)[mask]
  informative = se > 1e-3
  z = error[informative] / se[informative]
  return {
      "rb_actions": int(informative.sum()),
      "rb_coverage": float(np.mean(np.abs(error) <= 1.96 * se + 1e-9)),
      "rb_mean_z2": float(np.mean(z**2)) if len(z) else 0.0,
      "rb_mean_error": float(error.mean()),
      "rb_error_se": float(np.sqrt(np.sum(se**2)) / max(len(se), 1))
  }


class ShadowCritic:
  """A value model trained on another run's batches without affecting it: same architecture as the
  policy with a value head, one Adam step per batch towards Monte-Carlo returns. `values` must be
  read before `update` on the same batch, so scored credit never sees its own labels."""

  def __init__(self, model_config, actions, learning_rate: float):
    self.critic = Transformer(model_config.replace(value_head=True), rngs=nnx.Rngs(1))
    self.optimizer = nnx.Optimizer(self.critic, optax.adam(learning_rate), wrt=nnx.Param)
    # Regression towards Monte-Carlo returns.
    regression = learner.CriticSettings(clip=None, gamma=1.0, lam=1.0)
    self._values = nnx.jit(
        lambda critic, rollout: forward.critic_values(critic, rollout, actions))
    self._update = nnx.jit(lambda critic, optimizer, rollout: learner.critic_update(
        critic, optimizer, rollout, regression, actions))

  def values(self, rollout):
    return self._values(self.critic, rollout)

  def update(self, rollout) -> None:
    self._update(self.critic, self.optimizer, rollout.replace(values=self.values(rollout)))


class ScoringHook:
  """Scores the credit of the estimators `names` on the run's batches at `steps`
  (the policy that sampled them, before its update) and writes the results:
  agreement with the exact oracle, stability across `study.resamples`
  resampled groups around fixed probe responses, and the Monte-Carlo check.
  Critic-based credit (ppo_gae) comes from a shadow critic trained on every
  batch of this run."""

  def __init__(self, study, workdir: pathlib.Path, names: list[str], steps: set[int], *,
               critic_learning_rate: float):
    self.study, self.workdir, self.steps = study, workdir, steps
    # PRIME's PRM exists only in its own run; the exact oracle is always computed.
    self.names = [
        n for n in names if n != "oracle" and not study.estimators[n].get("learned", False)
    ]
    self.extras = extras.hook(estimators.from_config(
        {"sum": ["oracle", *(_advantage(study.estimators[n]) for n in self.names)]}))
    self.critic_learning_rate, self.critic = critic_learning_rate, None  # made at the first batch

  def credit(self, task, model, rollout, examples, key) -> tuple[dict, dict, int]:
    """({name: [B, T] credit} incl. the exact "oracle", the estimators' extras,
    the tokens generated by Monte-Carlo estimators)."""
    context = extras.Context(task, model, examples, key, None)
    computed, metrics = self.extras(context, rollout)
    scored = rollout.replace(values=self.critic.values(rollout),
                             extras={**rollout.extras, **computed})
    credit = {"oracle": np.asarray(computed["oracle_advantages"])}
    for name in self.names:
      credit[name] = np.asarray(
          estimators.from_config(_advantage(self.study.estimators[name]))(scored).advantages)
    return credit, computed, int(metrics.get("gen_tokens", 0))

  def resample(self, task, model, rollout, examples, key):
    """The batch with the first response of each group kept (the probe) and the
    other G - 1 replaced by fresh samples from the same policy."""
    prompt = task.max_prompt_length
    fresh = generate(model, rollout.tokens[:, :prompt], rollout.token_valid[:, :prompt], key,
                     max_new_tokens=task.max_response_length, stop_tokens=task.stop_tokens,
                     pad_id=task.pad_id, actions=task.actions)
    rewards = task.score_rows(fresh.tokens, fresh.mask, examples)
    probe = jnp.asarray(np.arange(len(rewards)) % rollout.group_size == 0)
    keep = lambda old, new: jnp.where(probe.reshape((-1,) + (1,) * (jnp.ndim(new) - 1)), old, new)
    fields = {"tokens": "tokens", "mask": "mask", "behaviour_logprobs": "logprobs",
              "entropy": "entropy", "positions": "positions", "token_valid": "token_valid"}
    return rollout.replace(rewards=keep(rollout.rewards, jnp.asarray(rewards)),
                           **{f: keep(getattr(rollout, f), getattr(fresh, g))
                              for f, g in fields.items()})

  def __call__(self, context, rollout):
    if self.critic is None:  # the policy's architecture, with a value head
      self.critic = ShadowCritic(context.model.config, context.task.actions,
                                 self.critic_learning_rate)
    if context.rl_step in self.steps:
      task = context.task
      write_scores(
          self.workdir, task.name, context.rl_step,
          self.score(task, context.model, rollout, context.examples, context.key, context.rl_step))
    self.critic.update(rollout)
    return {}, {}

  def score(self, task, model, rollout, examples, key, rl_step) -> dict:
    """{"scores": one record per estimator, "mc_check": the Monte-Carlo check,
    "dump": the arrays of the batch and every credit} for the batch of `rl_step`."""
    tokens, mask = np.asarray(rollout.tokens), np.asarray(rollout.mask)
    decisive = decisive_mask(task, tokens.shape)
    credit, computed, vine_tokens = self.credit(task, model, rollout, examples,
                                                jax.random.fold_in(key, CREDIT_STREAM))
    probes = np.arange(0, len(tokens), rollout.group_size)
    resampled = {name: [] for name in credit}
    for r in range(self.study.resamples):
      fresh = self.resample(task, model, rollout, examples,
                            jax.random.fold_in(key, RESAMPLE_STREAM + r))
      fresh_credit, _, _ = self.credit(task, model, fresh, examples,
                                       jax.random.fold_in(key, RESAMPLED_CREDIT_STREAM + r))
      for name, values in fresh_credit.items():
        resampled[name].append(values[probes])
    records = []
    for name, values in credit.items():
      row = scores.score(values, credit["oracle"], mask, decisive=decisive)
      if self.study.resamples:
        row.update(
            scores.resampling_noise(np.stack(resampled[name]), credit["oracle"][probes],
                                    mask[probes]))
      stats = {k: {"value": s.value, "defined": s.defined, "n": s.n} for k, s in row.items()}
      records.append({"estimator": name, "gen_tokens": vine_tokens if name == "vineppo" else 0,
                      **stats})
    dump = dict(tokens=tokens, mask=mask, rewards=np.asarray(rollout.rewards), decisive=decisive,
                oracle_stderr=np.zeros(mask.shape, np.float32), **credit)  # the oracle is exact
    check = self.mc_check(task, model, rollout, examples, key, computed["oracle_values"],
                          credit["oracle"], rl_step)
    return {"scores": records, "mc_check": check, "dump": dump}

  def mc_check(self, task, model, rollout, examples, key, oracle_values, oracle_advantages,
               rl_step) -> dict:
    """The Monte-Carlo checks on the first `study.mc_check_rows` rows: plain Monte-Carlo values
    against the exact ones (T2 calibration, T1 telescoping) and Rao-Blackwellised
    credit against the exact credit (T3)."""
    rows = slice(0, self.study.mc_check_rows)
    tokens, mask = np.asarray(rollout.tokens)[rows], np.asarray(rollout.mask)[rows]
    token_valid, examples = np.asarray(rollout.token_valid)[rows], examples[rows]
    k = self.study.mc_check_k
    check = monte_carlo.mc_credit(model, task, tokens, mask, token_valid, examples,
                                  jax.random.fold_in(key, MC_CHECK_STREAM), k=k, positions="all")
    result = monte_carlo_check(
        np.asarray(oracle_values)[rows], check, k, np.random.default_rng(rl_step))
    rewards = np.asarray(rollout.rewards)[rows]
    telescoping = np.abs(np.asarray(check.advantages).sum(1) - (rewards - np.asarray(
        estimators.first_value(check.values, mask)))).max()
    rb = rao_blackwell.rb_credit(model, task, tokens, mask, token_valid, examples,
                               jax.random.fold_in(key, RB_CHECK_STREAM), k=k, positions="all",
                               logprobs=np.asarray(rollout.behaviour_logprobs)[rows])
    result.update(rb_check(oracle_advantages[rows], rb, mask))
    return {"telescoping_error": float(telescoping), **result}


def write_scores(workdir: pathlib.Path, task: str, rl_step: int, scored: dict) -> None:
  """Appends a scored batch (`ScoringHook.score`) to scores.jsonl and
  mc_check.jsonl and writes its arrays to credit_dump_step<N>.npz."""
  with open(workdir / "scores.jsonl", "a") as f:
    for record in scored["scores"]:
      f.write(json.dumps({"task": task, "step": rl_step, **record}) + "\n")
  with open(workdir / "mc_check.jsonl", "a") as f:
    f.write(json.dumps({"task": task, "step": rl_step, **scored["mc_check"]}) + "\n")
  np.savez_compressed(workdir / f"credit_dump_step{rl_step}.npz", **scored["dump"])


class RunStopped(Exception):
  """A signal (SIGTERM, Ctrl-C) stopped one of a study's runs; a rerun resumes it."""


def train_once(config, run_dir: pathlib.Path, hook, label: str) -> float:
  """Trains `config` in `run_dir` with the rollout `hook` (printing `label`) unless an
  earlier call finished it: wall_seconds.json, written when a run completes, marks that
  and a rerun skips it. Returns the run's wall seconds, summed over the invocations that
  trained it.

  Raises RunStopped when a signal stopped the run: it is not marked finished (its
  checkpoint resumes it) and the study stops rather than going on to the next run."""
  finished, partial = run_dir / "wall_seconds.json", run_dir / "wall_seconds_partial.json"
  if not finished.exists():
    print(f"{label} -> {run_dir}", flush=True)
    started = time.perf_counter()
    result = loop.run(config, str(run_dir), rollout_hook=hook)
    seconds = time.perf_counter() - started
    seconds += json.loads(partial.read_text()) if partial.exists() else 0.0
    if result["stopped"]:
      partial.write_text(json.dumps(seconds))
      raise RunStopped(f"{label} was stopped at step {result['step']}; rerun the study with "
                       "the same --workdir to resume it.")
    finished.write_text(json.dumps(seconds))
  return json.loads(finished.read_text())


def run(study, workdir: str) -> dict:
  """Trains every (task, estimator, seed), scores credit, writes the report; returns the curves."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "study_config.json").write_text(study.to_json_best_effort(indent=2))
  already_scored = (workdir / "scores.jsonl").exists()
  curves, wall = {}, {}
  started = time.perf_counter()
  for task, spec in study.tasks.items():
    steps = spec.train.rl.steps
    score_steps = {min(int(round(f * steps)), steps - 1) for f in study.score_at}
    for name in spec.estimators:
      for seed in study.seeds:
        run_dir = workdir / "runs" / task / name / f"seed{seed}"
        config = train_config(study, task, name, seed, str(workdir / "data"))
        hook = exact_metrics.hook(spec.train.rl.eval_every)  # exact J(pi), pass@k
        if spec.scored and name == "grpo" and seed == study.seeds[0] and not already_scored:
          hook = extras.chain(ScoringHook(study, workdir, list(spec.estimators), score_steps,
                                          critic_learning_rate=spec.train.critic.learning_rate),
                              hook)
        wall[f"{task}/{name}/seed{seed}"] = train_once(config, run_dir, hook,
                                                       f"[study] {task}: {name} seed {seed}")
        curves.setdefault(task, {}).setdefault(name, {})[seed] = exact_metrics.read_curve(run_dir)
  wall["this invocation"] = time.perf_counter() - started
  wall["total (all runs)"] = sum(v for k, v in wall.items() if "/" in k)
  curves_json = json.dumps({"curves": curves, "wall_seconds": wall}, indent=1)
  (workdir / "curves.json").write_text(curves_json)
  report.write(study, workdir, curves, wall)
  print(f"[study] wrote {workdir / 'report.md'} ({wall['this invocation']:.0f} s)", flush=True)
  return curves


def share_compilations(workdir: str) -> None:
  """Runs in this process share their compiled programs (the same shapes) through
  WORKDIR/jax-cache: a program the study's runs have in common compiles once."""
  jax.config.update("jax_compilation_cache_dir", str(pathlib.Path(workdir) / "jax-cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def cli(run_study: Callable[[ml_collections.ConfigDict, str], object], description: str) -> None:
  """Runs `run_study(--config, --workdir)` as a program. The flags are defined here, when a
  runner is run, so that the lab's runners can import one another."""
  config = config_flags.DEFINE_config_file("config", None, description)
  workdir = flags.DEFINE_string("workdir", None, "Output directory (resumable).")
  flags.mark_flags_as_required(["config", "workdir"])

  def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    share_compilations(workdir.value)
    try:
      run_study(config.value, workdir.value)
    except RunStopped as error:
      raise SystemExit(f"Stopped: {error}") from error

  app.run(main)

