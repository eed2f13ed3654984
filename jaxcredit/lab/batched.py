"""Study cells with the seeds vmapped inside one jit: key_token, target_sum and zipf_explain
runs as pure functions (each task's registered traceable form, `tasks.Task.traceable`). ::

  cell = cells.Cell(task=key_token.KeyTokenConfig(...), model=preset("tiny", ...),
                    arms=({"scale": "rms", "of": "grpo"}, {"scale": "rms", "of": "oracle"}),
                    group_size=8, prompts_per_step=8, updates=100, eval_every=10)
  runner = batched.Runner(cell)
  result = runner.train([(arm, learning_rate, seed), ...])   # every run in one program

One run is a pure function of its arm (an index into cell.arms), learning rate and seed:

  - the policy `Transformer(cell.model, rngs=nnx.Rngs(seed))`, warm-started by a short SFT
    when the cell has a `Warmup` (the regime: confident filler, a starting success), with
    Adam (the learning rate in its state: `optax.inject_hyperparams`) after global-norm
    clipping;
  - each update u draws `prompts_per_step` prompts uniformly (key_token: from the |C|^K
    prompts; target_sum: a target S from its range) and samples `group_size` responses to
    each with the KV-cache sampler at temperature 1 (keys folded from
    `jax.random.key(seed)` and u; target_sum's responses end at EOS); the rule scores them;
  - the extras the estimator needs: the exact oracle's credit and values under the
    sampling policy (key_token: E-DEC, `key_token.oracle.decisive_values`, with filler
    hidden; E-TREE, `key_token.oracle.value_tree`, with filler visible; target_sum: E-TREE,
    `target_sum.oracle.value_tree`; zipf_explain, which has no exact oracle: the Rao-Blackwellised
    Monte-Carlo values of `zipf_explain.oracle` at each response's cuts, its own draws), the
    permutation draws of `oracle_shuffled`, KTAE's key-token
    scores (`token_statistics.ktae_scores`); for a
    Monte-Carlo arm (`vineppo`, `spo`) the values V-hat(s_t) of K continuations from each
    state at the arm's positions (every action, every k-th or the cutpoints:
    `monte_carlo.evaluated_positions`), drawn in distribution (`arms.monte_carlo_values`)
    and charged;
  - one learner step (`learner.make_step`: `cell.objective` on the whole batch, the arm's
    estimator chosen by `lax.switch`); in a cell with a critic arm (`arms.CRITICS`: `ppo_gae`)
    every run also trains a critic (the policy's architecture with a value head, its trunk
    copied from the starting policy) on the batch's returns, and its values V(s_t) are the
    batch's `values`; in a cell with a PRIME arm every run also trains PRIME's implicit PRM
    (`implicit_prm.update`, a copy of the starting policy, its Adam rate a setting of the
    run's arm: `Cell.prm_learning_rates`) on the batch's outcomes after the batch is scored
    with it, against a frozen copy of the starting policy;
  - exact J(pi) = mean_x V^pi(x) and pass@k on the evaluation prompts (every prompt when
    there are at most `eval_prompts`, else a fixed sample) before updates 0, E, 2E, ...
    and after the last; on filler-blind key_token also the policy's distribution over the
    keys at each decisive position (`key_token.oracle.decisive_distributions`).

A `Runner` compiles one program for all its runs: `jax.vmap` over them of a `lax.scan` over
evaluation blocks, each a `lax.scan` over E updates (under vmap every arm's estimator is
computed for every run and the run's own selected: estimators are cheap next to sampling).
Calls with the same number of runs (`width`) reuse the compiled program, and so do the
calls of every `Runner` of an equal cell in the process (the most recent `CACHED_PROGRAMS`
programs are kept). Generated tokens
are the policy's samples only, counted per run (on key_token every arm generates B T
tokens per update; target_sum's responses stop at EOS); the oracle is uncharged. Charged
tokens add what a Monte-Carlo arm's continuations would generate: K (T - t) for each
evaluated state at response step t (t = 0, ..., T - 1; on target_sum, whose continuations may stop
at EOS, an upper bound). Charged FLOPs count the model FLOPs of sampling, the learner's step
and what the arm reads (a critic, PRIME's implicit PRM, Monte-Carlo continuations):
`lab.compute`.
target_sum cells take no warmup and no gradient measurements (both read key_token's
decisive positions); zipf_explain cells take a warmup (its grammar's demonstrations) and no
gradient measurements, and their J(pi) is the oracle's estimate (EVAL_PATHS continuations
per evaluation prompt: `zipf_explain.traceable`), not exact.
"""

import collections
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxcredit import estimators, forward, losses
from jaxcredit.lab import arms, compute, diagnostics, gradients
from jaxcredit.lab.cells import Cell
from jaxcredit.lab.update_batch import (EVAL_STREAM, MC_STREAM, MECHANISM_STREAM, WARMUP_STREAM,
                                        make_rollout, traceable_task, with_models)
from jaxcredit.models import Transformer
from jaxcredit.rollout import Estimate, Rollout
from jaxcredit.sampling import tree as sampling_tree
from jaxcredit.tasks import key_token, target_sum
from jaxcredit.train import learner

UPDATE_METRICS = ("reward_mean", "zero_variance_groups", "entropy", "grad_norm")


def starting_policy(cell: Cell, seed) -> Transformer:
  """The policy a run of `seed` starts from: initialised from `seed`, then warm-started
  (`warm_start`, its demonstrations keyed by the run's warmup stream) when the cell has a
  `Warmup`. Traceable.

  Args:
    cell: the batched `Cell`.
    seed: the run's seed, an int or a traced int32 scalar.

  Returns:
    the `Transformer`.
  """
  model = Transformer(cell.model, rngs=nnx.Rngs(jax.random.key(seed)))  # = nnx.Rngs(seed)
  if cell.warmup is not None:
    warm_start(model, traceable_task(cell), cell,
               jax.random.fold_in(jax.random.key(seed), WARMUP_STREAM))
  return model


def _demonstrations(task, cell: Cell, key):
  """[N, P + T] SFT rows (`Warmup`, drawn by the task) and their response mask."""
  prompts, response = task.demonstrations(key, cell.warmup, cell.warmup.batch_size)
  tokens = jnp.concatenate([prompts, response], axis=1)
  return tokens, jnp.broadcast_to(jnp.arange(tokens.shape[1]) >= prompts.shape[1], tokens.shape)


def warm_start(model, task, cell: Cell, key) -> None:
  """The policy after ``cell.warmup`` (module docstring), in place: `forward.sft_loss` on the
  task's demonstrations, one fresh batch per step, with its own Adam. Traceable.

  Args:
    model: the policy.
    task: the cell's traceable task.
    cell: the batched `Cell`.
    key: the demonstrations' PRNG key.
  """
  adam = nnx.Optimizer(model, optax.adam(cell.warmup.learning_rate), wrt=nnx.Param)
  sft_graphdef, sft_state = nnx.split((model, adam))

  def sft_step(sft_state, step):
    model, adam = nnx.merge(sft_graphdef, sft_state)
    tokens, mask = _demonstrations(task, cell, jax.random.fold_in(key, step))
    adam.update(model, nnx.grad(forward.sft_loss)(model, tokens, mask, None, task.actions))
    return nnx.state((model, adam)), None

  sft_state, _ = jax.lax.scan(sft_step, sft_state, jnp.arange(cell.warmup.steps))
  nnx.update(model, nnx.state(nnx.merge(sft_graphdef, sft_state)[0]))


def _columns(task, cell: Cell):
  """[P + T] bool (decisive, filler, seen) response columns: key_token's fixed decisive
  positions (none on target_sum, whose cells refuse the warmup and the gradient measurements
  that read them), its filler, and the columns later inputs see."""
  prompt_len, config = cell.task.prompt_length, cell.task
  decisive = np.zeros(prompt_len + config.length, bool)
  decisive[getattr(task, "decisive", [])] = True
  filler = ~decisive
  filler[:prompt_len] = False
  return decisive, filler, decisive | (filler & (not getattr(config, "filler_blind", False)))


def _update_metrics(task, cell: Cell, batch: Rollout, advantage, charges, decisive,
                    filler) -> dict:
  """What one update records beside the learner's UPDATE_METRICS: its generated and charged
  continuation tokens and the model FLOPs charged to the arm (`compute.update_flops`;
  `charges` = (K, critic, prime) of the arm, its K continuations from the states in
  extras["mc_evaluated"]); on key_token (T actions per response) the
  filler's entropy and the noisy tokens of the arm's credit (`advantage(batch)`); on
  target_sum (responses stop at EOS) the lengths of right and wrong responses and the wrong
  share."""
  mc_k, critic, prime = charges
  length, continued = cell.task.length, batch.extras.get("mc_evaluated", batch.mask)
  if cell.tree is None:
    shares, prompts = batch.mask.astype(jnp.float32), batch.shape[0]
  else:
    shares = sampling_tree.token_shares(batch.extras["tree_path"],
                                        batch.extras["tree_segments"], batch.mask)
    prompts = cell.prompts_per_step
  recorded = {"generated": jnp.round(jnp.sum(shares)),
              "continuations": arms.continuation_tokens(continued, mc_k, length),
              "flops": compute.update_flops(
                  cell.model, cell.task.prompt_length, shares[:, -length:], prompts,
                  continued=continued[:, -length:], k=mc_k, critic=critic, prime=prime)}
  if isinstance(task, key_token.traceable.Traceable):
    recorded.update(filler_entropy=jnp.mean(batch.entropy[:, filler]),
                    noisy_tokens=diagnostics.noisy_tokens(advantage(batch).advantages,
                                                          batch.mask, decisive))
  elif isinstance(task, target_sum.traceable.Traceable):
    recorded.update(zip(("length_correct", "length_incorrect"),
                        diagnostics.lengths_by_outcome(batch.mask, batch.rewards)))
    recorded["incorrect_share"] = jnp.mean(batch.rewards <= 0.5)
  return recorded


def make_run(cell: Cell):
  """The pure function of one run of a cell (module docstring); vmap it over runs.

  Args:
    cell: the batched `Cell`.

  Returns:
    ``run(arm, learning_rate, seed) -> (evaluations, metrics)``: evaluations are
    ``{"success": [n_evals], "pass@k": [n_evals, len(pass_at)]}``, metrics
    ``{metric: [updates]}``.
  """
  branches = [estimators.from_config(arm) for arm in cell.arms]
  task, beta = traceable_task(cell), arms.prm_beta(cell)
  actions, critic = task.actions, arms.has_critic(cell)

  def modules(seed, learning_rate, prm_learning_rate):
    model = starting_policy(cell, seed)
    return arms.modules(model, cell, learning_rate,
                        arms.critic(cell, model, seed) if critic else None, prm_learning_rate)

  graphdef, _ = nnx.split(nnx.eval_shape(lambda: modules(0, 1.0, 1.0)))
  objective = losses.from_config(cell.objective)
  # The critic regresses on Monte-Carlo returns (lambda = 1), clipped as in PPO.
  settings = learner.Settings(actions=actions,
                              critic=learner.CriticSettings() if critic else None,
                              tree=cell.tree, prompt_length=cell.task.prompt_length)
  eval_prompts, eval_targets = task.eval_prompts
  ks = jnp.asarray(cell.pass_at, jnp.float32)
  rollout = make_rollout(cell, arms.needs(branches))
  mc_settings, arm_critics, arm_primes = zip(*(arms.charges(branch) for branch in branches))
  arm_mc = arms.MonteCarlo(*(jnp.asarray(field) for field in zip(*mc_settings)))
  arm_critics, arm_primes = jnp.asarray(arm_critics), jnp.asarray(arm_primes)
  prm_rates = jnp.asarray(arms.prm_learning_rates(cell), jnp.float32)
  decisive, filler, seen = _columns(task, cell)
  keyed = isinstance(task, key_token.traceable.Traceable) and cell.task.filler_blind
  ranked = critic and keyed
  skipped = {name: jnp.zeros(()) for name in diagnostics.MECHANISM
             + (diagnostics.RANKING if ranked else ())}

  def evaluate(state, key):
    model = nnx.merge(graphdef, state)["model"]
    success = task.success(task.value_tree(model, eval_prompts, eval_targets, key))
    measured = {"success": jnp.mean(success),
                "pass@k": jnp.mean(1.0 - (1.0 - success[:, None]) ** ks, axis=0)}
    if keyed:
      measured["keys"] = key_token.oracle.decisive_distributions(model, cell.task, eval_prompts,
                                                                 eval_targets)
    return measured

  def run(arm, learning_rate, seed):
    key, mc = jax.random.key(seed), jax.tree.map(lambda field: field[arm], arm_mc)
    state = nnx.state(modules(seed, learning_rate, prm_rates[arm]))
    advantage = lambda rollout: Estimate(advantages=jax.lax.switch(
        arm, [lambda r, f=f: f(r).advantages for f in branches], rollout))
    step = learner.make_step(graphdef, advantage=advantage, objective=objective,
                             settings=settings)
    sample = lambda models, key: with_models(
        models, rollout(models["model"], key, oracle_extras=True, mc=mc), actions)
    gradient = lambda model, batch, credit: gradients.policy_gradient(
        objective, model, batch, credit, actions)
    rank = diagnostics.critic_ranking(task, cell.group_size, MC_STREAM) if ranked else None

    def update(state, u):
      models = nnx.merge(graphdef, state)
      # lambda-GRPO's learnt exponent before this batch's step (the one its weights use).
      preference = ({"length_preference_lam": models["length_preference"].lam[...]}
                    if "length_preference" in models else {})
      batch = with_models(models, rollout(models["model"], jax.random.fold_in(key, u),
                                          mc=mc), actions, prm_beta=beta, learn=True)
      if beta is not None or preference:  # steps taken in with_models
        state = nnx.state(models)
      state, metrics = step(state, batch, None, u)
      recorded = _update_metrics(task, cell, batch, advantage,
                                 (mc.k, arm_critics[arm], arm_primes[arm]), decisive, filler)
      return state, {**recorded, **preference,
                     **{name: metrics[name] for name in UPDATE_METRICS}}

    def measure(state, start, index):
      measured = evaluate(state, jax.random.fold_in(jax.random.fold_in(key, EVAL_STREAM), start))
      if cell.mechanism_batches:
        measure_key = jax.random.fold_in(jax.random.fold_in(key, MECHANISM_STREAM), start)
        mechanism = lambda: diagnostics.mechanism(
            sample, gradient, nnx.merge(graphdef, state), advantage, measure_key,
            batches=cell.mechanism_batches, decisive=decisive, seen=seen,
            group_size=cell.group_size, rank=rank)
        # `start` is the same for every run: under vmap this stays a branch, so the
        # evaluations without measurements cost nothing.
        measured.update(jax.lax.cond(
            jnp.isin(index, jnp.asarray(cell.measured_evals)), mechanism, lambda: skipped))
      return measured

    def until_the_end(step):
      """`step(state, u)` before update `cell.updates`; at it, the state unchanged and zero
      metrics, so that the last measurement is taken in the same scan (`measure` traced
      once). `u` is the same for every run: under vmap this stays a branch."""
      def skip(state, u):
        return state, jax.tree.map(jnp.zeros_like, jax.eval_shape(step, state, u)[1])
      return lambda state, u: jax.lax.cond(u < cell.updates, step, skip, state, u)

    updates_from = lambda state, start: jax.lax.scan(update, state,
                                                     start + jnp.arange(cell.eval_every))

    def block(state, start):
      measured = measure(state, start, start // cell.eval_every)
      state, metrics = until_the_end(updates_from)(state, start)
      return state, (measured, metrics)

    def measured_update(state, u):
      # `u` is the same for every run: under vmap the evaluation stays a branch, taken only
      # at the updates of `eval_updates`.
      index = jnp.searchsorted(eval_updates, u)
      due = eval_updates[jnp.minimum(index, cell.n_evals - 1)] == u
      measured = jax.lax.cond(due, lambda: measure(state, u, index), lambda: jax.tree.map(
          jnp.zeros_like, jax.eval_shape(measure, state, u, index)))
      state, metrics = until_the_end(update)(state, u)
      return state, (measured, metrics)

    eval_updates = jnp.asarray(cell.eval_updates)
    if cell.eval_at is None:  # a block of eval_every updates after each measurement
      _, (measured, metrics) = jax.lax.scan(block, state, eval_updates)
      metrics = jax.tree.map(lambda m: m[:-1].reshape(-1), metrics)
    else:
      _, (measured, metrics) = jax.lax.scan(measured_update, state, jnp.arange(cell.updates + 1))
      measured = jax.tree.map(lambda m: m[eval_updates], measured)
      metrics = jax.tree.map(lambda m: m[:-1], metrics)
    return measured, metrics

  return run


CACHED_PROGRAMS = 8
# (repr(cell), width) -> executable: a cell is a frozen value whose repr holds every field.
_compiled = collections.OrderedDict()


class Runner:
  """The compiled program of a cell's runs (module docstring).

  Args:
    cell: the batched `Cell`.
  """

  def __init__(self, cell: Cell):
    self.cell = cell
    self._program = jax.jit(jax.vmap(make_run(cell)))

  def _executable(self, width: int, arguments: tuple):
    """The program compiled for `width` runs (this cell's, if compiled before) and the seconds
    compiling took now (0 when reused)."""
    key = (repr(self.cell), width)
    if key in _compiled:
      _compiled.move_to_end(key)
      return _compiled[key], 0.0
    started = time.perf_counter()
    _compiled[key] = self._program.lower(*arguments).compile()
    if len(_compiled) > CACHED_PROGRAMS:
      _compiled.popitem(last=False)
    return _compiled[key], time.perf_counter() - started

  def train(self, runs: Sequence[tuple[int, float, int]], width: int | None = None) -> dict:
    """Trains `runs` [(arm index, learning rate, seed), ...] together, padded to `width`
    runs (repeating the last; the same width reuses the compiled program). Returns numpy
    arrays over the runs: "success" [N, n_evals] (exact J), "pass@k" {k: [N, n_evals]}, the
    per-update metrics [N, updates]; "updates" [n_evals] and "gen_tokens" [N, n_evals] (the
    response tokens each run generated before each measurement) and "charged_tokens" [N,
    n_evals] (those and its Monte-Carlo continuations') and "charged_flops" [N, n_evals] (the
    model FLOPs charged to its arm, `compute`); on filler-blind key_token, "final_keys" [N,
    n_eval_prompts, K, |C|], the policy's keys at the last evaluation
    (`key_token.oracle.decisive_distributions`), and "key_targets" [N, n_eval_prompts, K], the
    right keys' indices in C; the MECHANISM (and RANKING, with a
    critic on filler-blind key_token) measurements [N, len(cell.measured_evals)] and their
    "mechanism_gen_tokens"; "compile_seconds" (0 when reused) and "run_seconds"."""
    runs = [(int(a), float(r), int(s)) for a, r, s in runs]
    if not runs or any(not 0 <= a < len(self.cell.arms) for a, _, _ in runs):
      raise ValueError(f"Expected runs (arm index in [0, {len(self.cell.arms)}), learning "
                       f"rate, seed), got {runs}.")
    width = max(width or len(runs), len(runs))
    padded = runs + [runs[-1]] * (width - len(runs))
    arguments = (jnp.asarray([a for a, _, _ in padded], jnp.int32),
                 jnp.asarray([r for _, r, _ in padded], jnp.float32),
                 jnp.asarray([s for _, _, s in padded], jnp.int32))
    executable, compile_seconds = self._executable(width, arguments)
    started = time.perf_counter()
    measured, metrics = jax.block_until_ready(executable(*arguments))
    run_seconds = time.perf_counter() - started
    kept = lambda x: np.asarray(x, np.float64)[:len(runs)]
    updates = np.asarray(self.cell.eval_updates)
    pass_at = kept(measured["pass@k"])
    evals = list(self.cell.measured_evals)
    so_far = lambda per_update: np.concatenate(
        [np.zeros((len(runs), 1)), np.cumsum(per_update, axis=1)], axis=1)[:, updates]
    gen_tokens = so_far(kept(metrics["generated"]))
    charged = so_far(kept(metrics["generated"]) + kept(metrics["continuations"]))
    charged_flops = so_far(kept(metrics["flops"]))
    final_keys = kept(measured["keys"])[:, -1] if "keys" in measured else None
    return {
        "success": kept(measured["success"]),
        "pass@k": {k: pass_at[..., i] for i, k in enumerate(self.cell.pass_at)},
        **{name: kept(measured[name])[:, evals]
           for name in diagnostics.MECHANISM + diagnostics.RANKING if evals and name in measured},
        "updates": updates,
        "gen_tokens": gen_tokens,
        "charged_tokens": charged,
        "charged_flops": charged_flops,
        **({"final_keys": final_keys, "key_targets": np.broadcast_to(
            np.asarray(traceable_task(self.cell).eval_prompts[1]) - key_token.KEY0,
            final_keys.shape[:3])}
           if "keys" in measured else {}),
        **({"mechanism_gen_tokens": gen_tokens[:, evals]} if evals else {}),
        **{name: kept(value) for name, value in metrics.items()
           if name not in ("generated", "continuations", "flops")},
        "compile_seconds": compile_seconds,
        "run_seconds": run_seconds,
    }
