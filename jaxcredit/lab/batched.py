"""Study cells with the seeds vmapped inside one jit: key_token, target_sum and zipf_explain
runs as pure functions (each task's registered traceable form, `tasks.Task.traceable`).

  cell = batched.Cell(task=key_token.KeyTokenConfig(...), model=preset("tiny", ...),
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
    Monte-Carlo arm (`vineppo` at every action, the `oracle_mc_K` ladder) the values
    V-hat(s_t) of K continuations from every action's state, drawn in distribution
    (`monte_carlo_values`) and charged;
  - one learner step (`learner.make_step`: `cell.objective` on the whole batch, the arm's
    estimator chosen by `lax.switch`); in a cell with a critic arm (CRITICS: `ppo_gae`)
    every run also trains a critic (the policy's architecture with a value head, its trunk
    copied from the starting policy) on the batch's returns, and its values V(s_t) are the
    batch's `values`; in a cell with a PRIME arm every run also trains PRIME's implicit PRM
    (`implicit_prm.update`, a copy of the starting policy, its Adam rate a setting of the
    run's arm: `Cell.prm_learning_rates`) on the batch's outcomes after the batch is scored
    with it, against a frozen copy of the starting policy;
  - exact J(pi) = mean_x V^pi(x) and pass@k on the evaluation prompts (every prompt when
    there are at most `eval_prompts`, else a fixed sample) before updates 0, E, 2E, ...
    and after the last.
A `Runner` compiles one program for all its runs: `jax.vmap` over them of a `lax.scan` over
evaluation blocks, each a `lax.scan` over E updates (under vmap every arm's estimator is
computed for every run and the run's own selected: estimators are cheap next to sampling).
Calls with the same number of runs (`width`) reuse the compiled program. Generated tokens
are the policy's samples only, counted per run (on key_token every arm generates B T
tokens per update; target_sum's responses stop at EOS); the oracle is uncharged. Charged
tokens add what a Monte-Carlo arm's continuations would generate: K (T - t) for the
action at response step t (t = 0, ..., T - 1; on target_sum, whose continuations may stop
at EOS, an upper bound).
target_sum cells take no warmup and no gradient measurements (both read key_token's
decisive positions); zipf_explain cells take a warmup (its grammar's demonstrations) and no
gradient measurements, and their J(pi) is the oracle's estimate (`ZipfExplain.EVAL_PATHS`
continuations per evaluation prompt), not exact.
"""

import dataclasses
import time
from collections.abc import Mapping, Sequence

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxcredit import estimators, forward, losses, tasks
from jaxcredit.credit import implicit_prm, token_statistics
from jaxcredit.models import Transformer, TransformerConfig
from jaxcredit.rollout import Estimate, Rollout
from jaxcredit.sampling import Actions, generate
from jaxcredit.tasks import key_token, target_sum, zipf_explain
from jaxcredit.train import learner

PROMPT_STREAM, SAMPLE_STREAM, EXTRAS_STREAM, NOISE_STREAM = 0, 1, 2, 3
EXTRAS = ("oracle_advantages", "oracle_values", "shuffle_priorities", "ktae_scores",
          "prm_logprobs", *estimators.registered.MC_VALUES)  # what a cell can compute
UPDATE_METRICS = ("reward_mean", "zero_variance_groups", "entropy", "grad_norm")

WARMUP_STREAM, MECHANISM_STREAM, MC_STREAM, CRITIC_STREAM = 4, 5, 6, 7
# The options of the tasks whose traceable form a cell runs.
TaskOptions = (key_token.KeyTokenConfig | target_sum.TargetSumConfig
               | zipf_explain.ZipfExplainConfig)
ORACLE_STREAM, EVAL_STREAM = 8, 9  # a Monte-Carlo oracle's draws (zipf_explain)
CRITICS = ("gae",)  # estimators that read a learned critic's values V(s_t) (rollout.values)
CRITIC_LEARNING_RATE = 1e-3  # the critic's Adam (the policy's rate is tuned per arm)
PRM_LEARNING_RATE = 1e-3  # PRIME's implicit PRM's Adam
RANKING_KS = (1, 4, 16, 64)  # Monte-Carlo rankings of the alternatives beside the critic's
RANKING = ("critic_top1", "random_top1", *(f"mc{k}_top1" for k in RANKING_KS))
MECHANISM = ("cosine_to_exact", "signal_fraction", "decisive_norm", "filler_norm",
             "credit_cosine", "implicit_credit_cosine")
DEFAULT_OBJECTIVE = {"policy": {"name": "ppo_clip", "aggregation": "seq-mean-token-sum-norm"}}
MAX_TREE_PATHS = 4096  # E-TREE paths per prompt inside a batched run (visible filler)


@dataclasses.dataclass(frozen=True)
class Warmup:
  """A short SFT of the initial policy before RL (its own Adam), which sets the regime the
  run starts in: demonstrations (the task's) whose decisive tokens are the right key with
  probability `key_accuracy`, else a uniform key (0: success stays at chance); on key_token
  their filler is drawn from `filler_probs` (over the task's filler alphabet F: a peaked
  distribution gives confident filler), on zipf_explain their text from its grammar. The
  loss is the mean negative log-likelihood of the response tokens."""

  steps: int
  filler_probs: tuple[float, ...] | None = None  # key_token's (zipf_explain: None)
  key_accuracy: float = 0.0
  batch_size: int = 64
  learning_rate: float = 1e-3

  def __post_init__(self):
    if not 0 <= self.key_accuracy <= 1:
      raise ValueError(f"warmup.key_accuracy must be in [0, 1], got {self.key_accuracy}.")


@dataclasses.dataclass(frozen=True)
class Cell:
  """One study cell: the task, the policy architecture, the arms (`estimators.from_config`
  specs) and the training settings its runs share."""

  task: TaskOptions
  model: TransformerConfig
  arms: tuple[str | Mapping, ...]
  group_size: int
  prompts_per_step: int
  updates: int
  eval_every: int
  max_grad_norm: float = 1.0
  objective: Mapping = dataclasses.field(default_factory=lambda: DEFAULT_OBJECTIVE)
  eval_prompts: int = 256
  pass_at: tuple[int, ...] = (1, 4, 16, 64)
  warmup: Warmup | None = None
  mechanism_batches: int = 0  # > 0: the gradient measurements (below) at...
  mechanism_evals: tuple[int, ...] | None = None  # ...these evaluations (None: every one)
  # The implicit PRM's Adam rate in each arm's runs (None: PRM_LEARNING_RATE), with a PRIME
  # arm: a setting of the arm, as its estimator config.
  prm_learning_rates: tuple[float | None, ...] | None = None

  def __post_init__(self):
    if self.updates < 1 or self.eval_every < 1 or self.updates % self.eval_every:
      raise ValueError(f"updates ({self.updates}) must be a positive multiple of eval_every "
                       f"({self.eval_every}).")
    if self.group_size < 1 or self.prompts_per_step < 1:
      raise ValueError(f"group_size and prompts_per_step must be >= 1, got {self.group_size} "
                       f"and {self.prompts_per_step}.")
    for arm in self.arms:
      monte_carlo_k(estimators.from_config(arm))  # refuses Monte-Carlo values it cannot draw
    if self.prm_learning_rates is not None and len(self.prm_learning_rates) != len(self.arms):
      raise ValueError(f"prm_learning_rates needs one rate (or None) per arm: "
                       f"{len(self.prm_learning_rates)} for {len(self.arms)} arms.")
    if isinstance(self.task, target_sum.TargetSumConfig):
      if self.warmup is not None or self.mechanism_batches:
        raise ValueError("target_sum cells run without a warmup and without the gradient "
                         "measurements (both are defined by key_token's decisive positions).")
      paths = target_sum.oracle.passes_per_prompt(self.task)
    elif isinstance(self.task, zipf_explain.ZipfExplainConfig):
      if self.mechanism_batches or (self.warmup is not None
                                    and self.warmup.filler_probs is not None):
        raise ValueError("zipf_explain cells run without the gradient measurements (its "
                         "decisive columns differ from response to response), and a warmup "
                         f"without filler_probs (its text is the grammar's); got {self.warmup}.")
      paths = 0
    elif not self.task.constrained:
      raise ValueError("Batched cells measure J(pi) with the exact oracle: key_token must be "
                       "constrained (keys at the decisive positions, filler elsewhere).")
    else:
      paths = 0 if self.task.filler_blind else key_token.oracle.passes_per_prompt(self.task)
    if paths > MAX_TREE_PATHS:
      raise ValueError(f"The exact oracle (E-TREE) runs {paths:,} paths per prompt, over "
                       f"{MAX_TREE_PATHS:,}: on key_token place the decisive positions earlier "
                       "or use fewer fillers; on target_sum use fewer digits or values.")
    if self.warmup is not None and isinstance(self.task, key_token.KeyTokenConfig) and (
        self.warmup.filler_probs is None or len(self.warmup.filler_probs) != self.task.n_fillers
        or not np.isclose(sum(self.warmup.filler_probs), 1.0)
        or min(self.warmup.filler_probs) < 0):
      raise ValueError(f"warmup.filler_probs must be {self.task.n_fillers} probabilities "
                       f"summing to 1; got {self.warmup}.")
    if self.mechanism_evals is not None and (
        not self.mechanism_evals or sorted(set(self.mechanism_evals)) != list(self.mechanism_evals)
        or not 0 <= self.mechanism_evals[0] <= self.mechanism_evals[-1] < self.n_evals):
      raise ValueError(f"mechanism_evals must be increasing evaluation indices in [0, "
                       f"{self.n_evals}), got {self.mechanism_evals}.")

  @property
  def n_evals(self) -> int:
    """Evaluations of a run: before updates 0, E, 2E, ... and after the last."""
    return self.updates // self.eval_every + 1

  @property
  def measured_evals(self) -> tuple[int, ...]:
    """The evaluations (indices) at which the gradient measurements are taken."""
    if not self.mechanism_batches:
      return ()
    return tuple(range(self.n_evals)) if self.mechanism_evals is None else self.mechanism_evals

  @property
  def tokens_per_update(self) -> int:
    """Response slots sampled per update: the generated tokens on key_token (T per
    response), an upper bound on target_sum (a response may stop before n + 1)."""
    return self.prompts_per_step * self.group_size * self.task.length


def noisy_tokens(advantages, mask, decisive):
  """The effective number of noisy tokens of a batch of credit: over the responses with any
  credit, the mean of sum_{t not in P} w_t, where w_t = |A_t| / max_t' |A_t'| is token t's
  credit weight within its response (broadcast credit: T - K; exact credit on filler-blind
  key_token: 0). advantages, mask [B, L]; decisive [L] or [B, L] bool (P). A scalar; 0 when
  no response has credit. Traceable."""
  weight = jnp.where(mask, jnp.abs(advantages), 0.0)
  top = jnp.max(weight, axis=-1, keepdims=True)
  per_row = jnp.sum(jnp.where(decisive, 0.0, weight / jnp.where(top > 0, top, 1.0)), axis=-1)
  credited = top[:, 0] > 0
  return jnp.sum(jnp.where(credited, per_row, 0.0)) / jnp.maximum(jnp.sum(credited), 1)


def lengths_by_outcome(mask, rewards):
  """(mean length of the rewarded responses, of the others): a response's length is its
  action count (mask [B, L]); rewards [B] in {0, 1} (> 0.5 counts as rewarded). 0 for an
  outcome no response has. Traceable."""
  lengths = jnp.sum(mask, axis=1, dtype=jnp.float32)
  right = rewards > 0.5
  mean = lambda where: jnp.sum(jnp.where(where, lengths, 0.0)) / jnp.maximum(jnp.sum(where), 1)
  return mean(right), mean(~right)


def implicit_credit(credit, tokens, seen, group_size: int):
  """[B, L]: each token's credit averaged over the responses of its group that reach the
  same state and take the same token there. A state is the prompt, the position and the
  earlier tokens that later inputs see (`seen`: on filler-blind key_token the decisive
  ones only), so identical (state, token) pairs share one policy-gradient term: this is the
  credit the gradient sees, GRPO's implicit process reward (arXiv 2509.21154) where
  responses share states. credit, tokens [B, L] (groups of `group_size` consecutive rows,
  one prompt each); seen [L] bool. Traceable."""
  b, length = tokens.shape
  tokens = tokens.reshape(b // group_size, group_size, 1, length)
  credit = credit.reshape(b // group_size, 1, group_size, length)
  pairs = lambda x: x != jnp.swapaxes(x, 1, 2)  # [n, G, G, L]: row i vs row j
  differs = pairs(jnp.where(seen, tokens, 0)).astype(jnp.int32)
  apart_before = jnp.cumsum(differs, axis=-1) - differs > 0  # a decisive choice earlier
  shared = ~pairs(tokens) & ~apart_before
  return (jnp.sum(jnp.where(shared, credit, 0.0), axis=2) / jnp.sum(shared, axis=2)).reshape(
      b, length)


def alternative_values(tree, tokens, config: key_token.KeyTokenConfig, group_size: int):
  """[B, K, |C|]: the exact value of each response's state after each alternative key c at
  its k-th decisive position (its earlier decisive tokens as sampled), read from the value
  tree of the batch's prompts (one per group of `group_size` rows; E-DEC, filler hidden).
  tokens [B, P + T]. Traceable."""
  n_keys, prompt_len = config.n_keys, config.prompt_length
  index, alternatives = jnp.zeros(tokens.shape[0], jnp.int32), []
  for k, position in enumerate(config.decisive_positions):
    w = jnp.repeat(tree[k + 1], group_size, axis=0)  # [B, |C|^(k+1)]
    alternatives.append(jnp.take_along_axis(w, index[:, None] * n_keys + jnp.arange(n_keys),
                                            axis=1))
    index = index * n_keys + tokens[:, prompt_len + position] - key_token.KEY0
  return jnp.stack(alternatives, axis=1)


def critic_alternatives(critic, batch: Rollout, config: key_token.KeyTokenConfig,
                        actions: Actions):
  """[B, K, |C|]: the critic's value of the same states as `alternative_values` (the
  response with key c at its k-th decisive position, read after that token). Traceable."""
  n_keys, prompt_len = config.n_keys, config.prompt_length
  b, length = batch.tokens.shape
  columns = prompt_len + np.asarray(config.decisive_positions)
  rows = jnp.broadcast_to(batch.tokens[:, None, None], (b, len(columns), n_keys, length))
  rows = rows.at[:, np.arange(len(columns)), :, columns].set(
      key_token.KEY0 + jnp.arange(n_keys))  # [K, B, |C|]: key c at the k-th column
  repeat = lambda x: jnp.broadcast_to(x[:, None, None], rows.shape).reshape(-1, length)
  values = critic(actions.observe(rows.reshape(-1, length)), positions=repeat(batch.positions),
                  token_valid=repeat(batch.token_valid), logits=False).values
  values = values.reshape(b, len(columns), n_keys, length)
  return jnp.take_along_axis(values, jnp.asarray(columns)[None, :, None, None], axis=-1)[..., 0]


def top1_agreement(scores, exact):
  """The fraction of states [..., |C|] whose highest score (the first on ties) falls on an
  exactly best alternative (within 1e-6). Traceable."""
  best = jnp.max(exact, axis=-1, keepdims=True)
  chosen = jnp.take_along_axis(exact, jnp.argmax(scores, axis=-1)[..., None], axis=-1)
  return jnp.mean(chosen >= best - 1e-6)


def ranking(critic_scores, exact, key):
  """{RANKING: top-1 agreement with the exact values [B, K, |C|]}: of the critic's scores;
  of a random order (the share of exact maxima among the alternatives); and of Monte-Carlo
  values from k continuations per alternative (Binomial(k, V) / k, ties broken at random)
  for k in RANKING_KS. Traceable."""
  best = jnp.max(exact, axis=-1, keepdims=True)
  out = {"critic_top1": top1_agreement(critic_scores, exact),
         "random_top1": jnp.mean(jnp.mean(exact >= best - 1e-6, axis=-1))}
  draws_key, ties_key = jax.random.split(key)
  ties = jax.random.uniform(ties_key, exact.shape)
  for k in RANKING_KS:  # multiples of 1 / k: ties / (2 k) only breaks ties
    estimate = monte_carlo_values(jax.random.fold_in(draws_key, k), exact, True, k, k)
    out[f"mc{k}_top1"] = top1_agreement(estimate + ties / (2 * k), exact)
  return out


def _cosine(x, y, mask):
  """sum m x y / sqrt(sum m x^2 sum m y^2) (m: a mask, or True); 0 when either is 0."""
  x, y = jnp.where(mask, x, 0.0), jnp.where(mask, y, 0.0)
  return jnp.sum(x * y) / jnp.maximum(jnp.linalg.norm(x) * jnp.linalg.norm(y), 1e-30)


def _needs(advantages) -> set[str]:
  needs = {key for advantage in advantages for component in estimators.components(advantage)
           for key in component.needs}
  missing = needs - set(EXTRAS)
  if missing:
    raise ValueError(f"Batched cells compute the extras {', '.join(EXTRAS)}; the estimator "
                     f"needs {', '.join(sorted(missing))} too (train it with `jaxcredit.train`).")
  return needs


def monte_carlo_k(advantage) -> int:
  """K of the Monte-Carlo values an advantage function reads (its components needing
  "mc_values": `vineppo`, `spo`); 0 when it reads none. Batched cells draw them at every
  action only, and one K per arm."""
  readers = [c for c in estimators.components(advantage) if "mc_values" in c.needs]
  ks = {int(c.settings["k"]) for c in readers}
  positions = {c.settings["positions"] for c in readers}
  if len(ks) > 1 or positions - {"all"} or any(k < 1 for k in ks):
    raise ValueError(f"Batched cells draw Monte-Carlo values at every action (positions="
                     f"'all') with one K >= 1 per arm; got k {sorted(ks)}, positions "
                     f"{sorted(positions)}.")
  return ks.pop() if ks else 0


def monte_carlo_values(key, values, mask, k, largest: int):
  """[B, L] V-hat(s_t): the mean reward of k continuations from each action's state, 0 off
  `mask`. With a 0/1 reward the k continuations' successes are Binomial(k, V(s_t)), V the
  exact value (`values`, the oracle's, in rows): they are drawn as that count, the sum of
  k of `largest` uniform comparisons (k may be traced, 0 <= k <= largest). Traceable."""
  draws = jax.random.uniform(key, (*values.shape, largest)) < jnp.clip(values, 0.0, 1.0)[..., None]
  successes = jnp.sum(draws & (jnp.arange(largest) < k), axis=-1, dtype=jnp.float32)
  return jnp.where(mask, successes / jnp.maximum(k, 1), 0.0)


def continuation_tokens(mask, k, length: int):
  """Tokens k continuations from every action's state generate: k (T - t) summed over the
  actions at response step t (mask [B, L], whose last `length` columns are the response
  slots). Traceable."""
  remaining = jnp.arange(length, 0, -1, dtype=jnp.float32)  # T - t
  return k * jnp.sum(jnp.where(mask[:, -length:], remaining, 0.0))


def _optimizer(cell: Cell, model, learning_rate) -> nnx.Optimizer:
  adam = optax.chain(optax.clip_by_global_norm(cell.max_grad_norm),
                     optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate))
  return nnx.Optimizer(model, adam, wrt=nnx.Param)


def has_critic(cell: Cell) -> bool:
  """Whether an arm of the cell reads a learned critic (CRITICS): then every run of the cell
  trains one (its own arm may ignore it)."""
  return any(component.name in CRITICS for arm in cell.arms
             for component in estimators.components(estimators.from_config(arm)))


def _critic(cell: Cell, policy: Transformer, seed) -> Transformer:
  """The policy's architecture with a scalar value head (zero-initialised), its trunk a copy
  of the policy's (after any warm start), as PPO critics start from the SFT model."""
  critic = Transformer(dataclasses.replace(cell.model, value_head=True),
                       rngs=nnx.Rngs(jax.random.fold_in(jax.random.key(seed), CRITIC_STREAM)))
  nnx.update(critic, nnx.state(policy, nnx.Param))
  return critic


def prm_beta(cell: Cell) -> float | None:
  """beta of the cell's PRIME arms (components needing "prm_logprobs"), None without one:
  then every run of the cell trains an implicit PRM (its own arm may ignore it)."""
  betas = {float(c.settings["beta"]) for arm in cell.arms
           for c in estimators.components(estimators.from_config(arm)) if "prm_logprobs" in c.needs}
  if len(betas) > 1:
    raise ValueError(f"A cell trains one implicit PRM: its PRIME arms must share beta, got "
                     f"{sorted(betas)}.")
  return betas.pop() if betas else None


def prm_learning_rates(cell: Cell) -> tuple[float, ...]:
  """The implicit PRM's Adam rate in each arm's runs (`Cell.prm_learning_rates`)."""
  rates = cell.prm_learning_rates or (None,) * len(cell.arms)
  return tuple(PRM_LEARNING_RATE if rate is None else float(rate) for rate in rates)


def _modules(model, cell: Cell, learning_rate, critic=None,
             prm_learning_rate=PRM_LEARNING_RATE) -> dict:
  """The run's modules: the policy and its optimizer; the critic and its optimizer; with a
  PRIME arm, the implicit PRM (its Adam at `prm_learning_rate`, which may be traced) and
  the frozen reference, both copies of the starting policy (after any warm start), as
  PRIME starts them from the SFT model."""
  modules = {"model": model, "optimizer": _optimizer(cell, model, learning_rate)}
  adam = lambda rate: optax.chain(optax.clip_by_global_norm(cell.max_grad_norm), optax.adam(rate))
  if critic is not None:
    modules.update(critic=critic, critic_optimizer=nnx.Optimizer(
        critic, adam(CRITIC_LEARNING_RATE), wrt=nnx.Param))
  if prm_beta(cell) is not None:
    prm = nnx.clone(model)
    # Plain Adam, as the trainer's `implicit_prm.ImplicitPRM`.
    prm_adam = optax.inject_hyperparams(optax.adam)(learning_rate=prm_learning_rate)
    modules.update(prm=prm, prm_optimizer=nnx.Optimizer(prm, prm_adam, wrt=nnx.Param),
                   reference=nnx.clone(model))
  return modules


def with_models(models: dict, batch: Rollout, actions: Actions,
                prm_beta: float | None = None) -> Rollout:
  """The batch with what its arms read from the run's other models: the critic's values
  V(s_t) (the learner step keeps them: `learner.prepare`); the reference's log-probs and
  the implicit PRM's, 0 off the mask. PRIME scores a batch with the PRM before that batch
  updates it: with `prm_beta` the PRM also takes that step here (`implicit_prm.update`, in
  place), whose pre-update log-probs are the batch's."""
  if "critic" in models:
    batch = batch.replace(values=forward.critic_values(models["critic"], batch, actions))
  if "prm" in models:
    logprobs = lambda model: jnp.where(
        batch.mask, forward.policy_outputs(model, batch, 1.0, actions).logprobs, 0.0)
    batch = batch.replace(ref_logprobs=logprobs(models["reference"]))
    if prm_beta is None:
      prm_logprobs = logprobs(models["prm"])
    else:
      _, prm_logprobs = implicit_prm.update(models["prm"], models["prm_optimizer"], batch,
                                            actions, prm_beta, 1.0)
    batch = batch.replace(extras={**batch.extras, "prm_logprobs": prm_logprobs})
  return batch


def _task(cell: Cell):
  """The traceable form of the cell's task (`tasks.Task.traceable`)."""
  return tasks.of_options(cell.task).traceable(cell.task, cell.eval_prompts)


def _policy(cell: Cell, seed) -> Transformer:
  return Transformer(cell.model, rngs=nnx.Rngs(jax.random.key(seed)))  # = nnx.Rngs(seed)


def make_rollout(cell: Cell, needs=frozenset(EXTRAS)):
  """rollout(model, key, oracle_extras=False, mc_k=0) -> Rollout: one update's batch of the
  cell (module docstring), with the extras in `needs` (all of them with oracle_extras;
  Monte-Carlo values of mc_k continuations, which may be traced, 0 for none). Traceable."""
  task, group, config = _task(cell), cell.group_size, cell.task
  actions, prompt_len = task.actions, config.prompt_length
  largest_k = max(monte_carlo_k(estimators.from_config(arm)) for arm in cell.arms)
  value_needs = {"oracle_advantages", "oracle_values", *estimators.registered.MC_VALUES}

  def rollout(model, key, oracle_extras=False, mc_k=0):
    prompts, targets = task.draw(jax.random.fold_in(key, PROMPT_STREAM), cell.prompts_per_step)
    sample = generate(model, jnp.repeat(prompts, group, axis=0),
                      jnp.ones((prompts.shape[0] * group, prompt_len), bool),
                      jax.random.fold_in(key, SAMPLE_STREAM), max_new_tokens=config.length,
                      actions=actions, stop_tokens=task.stop_tokens)
    targets = jnp.repeat(targets, group, axis=0)
    rewards = task.reward(sample.tokens, targets, jax.random.fold_in(key, NOISE_STREAM))
    mask = sample.mask
    extras = {}
    if oracle_extras or needs & value_needs:
      tree = task.value_tree(model, prompts, targets[::group],
                             jax.random.fold_in(key, ORACLE_STREAM))
      values, credit = task.credit(tree, sample.tokens, targets, group)
      in_rows = lambda x: jnp.where(mask, jnp.pad(x, [(0, 0), (prompt_len, 0)]), 0.0)
      extras.update(oracle_values=in_rows(values), oracle_advantages=in_rows(credit))
    if largest_k and (oracle_extras or "mc_values" in needs):
      extras.update(mc_values=monte_carlo_values(jax.random.fold_in(key, MC_STREAM),
                                                 extras["oracle_values"], mask, mc_k, largest_k),
                    mc_evaluated=mask)
    if oracle_extras or "ktae_scores" in needs:
      extras["ktae_scores"] = token_statistics.ktae_scores(
          sample.tokens, mask, rewards, group, vocab_size=task.vocab_size)
    if oracle_extras or "shuffle_priorities" in needs:
      extras["shuffle_priorities"] = jax.random.uniform(jax.random.fold_in(key, EXTRAS_STREAM),
                                                        mask.shape)
    # No KL term: the sampler's log-probs stand in for the reference's (no reference pass).
    return Rollout(tokens=sample.tokens, mask=mask, rewards=rewards,
                   behaviour_logprobs=sample.logprobs, ref_logprobs=sample.logprobs,
                   entropy=sample.entropy, truncated=sample.truncated, positions=sample.positions,
                   token_valid=sample.token_valid, extras=extras, group_size=group)

  return rollout


def make_run(cell: Cell):
  """The pure function (arm, learning_rate, seed) -> ({"success": [n_evals], "pass@k":
  [n_evals, len(pass_at)]}, {metric: [updates]}) of one run (module docstring); vmap it."""
  config, group = cell.task, cell.group_size
  branches = [estimators.from_config(arm) for arm in cell.arms]
  needs = _needs(branches)
  task = _task(cell)
  actions, prompt_len = task.actions, config.prompt_length
  critic, beta = has_critic(cell), prm_beta(cell)

  def modules(seed, learning_rate, prm_learning_rate, warm_start=None):
    model = _policy(cell, seed)
    if warm_start is not None:
      warm_start(model)
    return _modules(model, cell, learning_rate, _critic(cell, model, seed) if critic else None,
                    prm_learning_rate)

  graphdef, _ = nnx.split(nnx.eval_shape(lambda: modules(0, 1.0, 1.0)))
  objective = losses.from_config(cell.objective)
  # The critic regresses on Monte-Carlo returns (lambda = 1), clipped as in PPO.
  settings = learner.Settings(actions=actions,
                              critic=learner.CriticSettings() if critic else None)
  eval_prompts, eval_targets = task.eval_prompts
  ks = jnp.asarray(cell.pass_at, jnp.float32)

  def evaluate(state, key):
    success = task.success(task.value_tree(nnx.merge(graphdef, state)["model"], eval_prompts,
                                           eval_targets, key))
    return {"success": jnp.mean(success),
            "pass@k": jnp.mean(1.0 - (1.0 - success[:, None]) ** ks, axis=0)}

  rollout = make_rollout(cell, needs)
  arm_ks = jnp.asarray([monte_carlo_k(branch) for branch in branches], jnp.int32)
  prm_rates = jnp.asarray(prm_learning_rates(cell), jnp.float32)

  # key_token's fixed decisive positions (none on target_sum, whose cells refuse the warmup
  # and the gradient measurements that read them).
  decisive_columns = np.zeros(prompt_len + config.length, bool)
  decisive_columns[getattr(task, "decisive", [])] = True
  filler_columns = ~decisive_columns
  filler_columns[:prompt_len] = False
  seen_columns = decisive_columns | (filler_columns & (not getattr(config, "filler_blind", False)))

  def demonstrations(key):
    """[N, P + T] SFT rows (`Warmup`, drawn by the task) and their response mask."""
    prompts, response = task.demonstrations(key, cell.warmup, cell.warmup.batch_size)
    tokens = jnp.concatenate([prompts, response], axis=1)
    return tokens, jnp.broadcast_to(jnp.arange(tokens.shape[1]) >= prompt_len, tokens.shape)

  def warm_start(model, key):
    """The policy after `cell.warmup` (module docstring), in place."""
    adam = nnx.Optimizer(model, optax.adam(cell.warmup.learning_rate), wrt=nnx.Param)
    sft_graphdef, sft_state = nnx.split((model, adam))

    def sft_step(sft_state, step):
      model, adam = nnx.merge(sft_graphdef, sft_state)
      tokens, mask = demonstrations(jax.random.fold_in(key, step))
      demo = Rollout(tokens=tokens, mask=mask, rewards=jnp.zeros(tokens.shape[0]))
      nll = lambda m: losses.aggregate(
          -forward.policy_outputs(m, demo, 1.0, actions).logprobs, mask, "token-mean")
      adam.update(model, nnx.grad(nll)(model))
      return nnx.state((model, adam)), None

    sft_state, _ = jax.lax.scan(sft_step, sft_state, jnp.arange(cell.warmup.steps))
    nnx.update(model, nnx.state(nnx.merge(sft_graphdef, sft_state)[0]))

  def gradient(model, batch, advantages):
    """The objective's gradient [P] (flattened) for these token advantages."""
    loss = lambda m: objective(forward.policy_outputs(m, batch, 1.0, actions), batch,
                               Estimate(advantages=advantages))[0]
    return jax.flatten_util.ravel_pytree(nnx.grad(loss)(model))[0]

  ranked = critic and isinstance(task, key_token.traceable.Traceable) and config.filler_blind

  def mechanism(models, advantage, key, mc_k):
    """Over `cell.mechanism_batches` fresh batches from the current policy: the cosine of
    the arm's policy gradient with the exact-credit gradient on the same batch (the oracle's
    A, RMS-scaled like every arm's), the arm's signal fraction |mean g|^2 / mean |g|^2
    (1: every batch agrees; 1/R: pure noise over R batches), and the norms of its gradient
    restricted to the decisive and to the filler tokens (the gradient is linear in the
    advantages: the two parts sum to it); over tokens, the cosine of the arm's credit with
    the exact credit, raw and as the gradient sees it (`implicit_credit`); and with a critic
    on filler-blind key_token, how well it ranks the alternative keys (`ranking`)."""
    exact = estimators.from_config({"scale": "rms", "of": "oracle"})
    used = {name: models[name] for name in ("model", "critic", "prm", "reference")
            if name in models}
    models_graphdef, models_state = nnx.split(used)

    def on_batch(models_state, key):
      models = nnx.merge(models_graphdef, models_state)  # in this trace (nnx modules are not
      model = models["model"]  # shared across trace levels)
      batch = with_models(models, rollout(model, key, oracle_extras=True, mc_k=mc_k), actions)
      credit = advantage(batch).advantages
      g, g_exact = gradient(model, batch, credit), gradient(model, batch, exact(batch).advantages)
      on_decisive = gradient(model, batch, jnp.where(decisive_columns, credit, 0.0))
      cosine = _cosine(g, g_exact, True)
      implicit = implicit_credit(credit, batch.tokens, seen_columns, group)
      credit_cosines = (_cosine(credit, batch.extras["oracle_advantages"], batch.mask),
                        _cosine(implicit, batch.extras["oracle_advantages"], batch.mask))
      ranks = {}
      if ranked:
        prompts = batch.tokens[::group, :prompt_len]
        symbols = prompts[:, 1:1 + config.n_decisive] - key_token.KEY0
        _, targets = key_token.traceable.prompts_of(symbols, config)
        alternatives = alternative_values(task.value_tree(model, prompts, targets, None),
                                          batch.tokens, config, group)
        ranks = ranking(critic_alternatives(models["critic"], batch, config, actions),
                        alternatives, jax.random.fold_in(key, MC_STREAM))
      return (g, cosine, jnp.linalg.norm(on_decisive), jnp.linalg.norm(g - on_decisive),
              *credit_cosines, ranks)

    # One batch at a time: under the vmap over runs, batches side by side would hold every
    # batch's three backward passes at once (0.35 GiB per run at G = 32, 8 x 32 responses).
    keys = jax.random.split(key, cell.mechanism_batches)
    _, (g, cosine, decisive_norm, filler_norm, credit_cosine, implicit_cosine, ranks) = (
        jax.lax.scan(lambda state, batch_key: (state, on_batch(state, batch_key)),
                     models_state, keys))
    power = jnp.mean(jnp.sum(g**2, axis=1))
    mean_power = jnp.sum(jnp.mean(g, axis=0) ** 2)
    signal = jnp.where(power > 0, mean_power / jnp.where(power > 0, power, 1.0), 0.0)
    return {"cosine_to_exact": jnp.mean(cosine), "signal_fraction": signal,
            "decisive_norm": jnp.mean(decisive_norm), "filler_norm": jnp.mean(filler_norm),
            "credit_cosine": jnp.mean(credit_cosine),
            "implicit_credit_cosine": jnp.mean(implicit_cosine),
            **{name: jnp.mean(value) for name, value in ranks.items()}}

  def run(arm, learning_rate, seed):
    key, mc_k = jax.random.key(seed), arm_ks[arm]
    warm = None if cell.warmup is None else (
        lambda model: warm_start(model, jax.random.fold_in(key, WARMUP_STREAM)))
    state = nnx.state(modules(seed, learning_rate, prm_rates[arm], warm))
    advantage = lambda rollout: Estimate(advantages=jax.lax.switch(
        arm, [lambda r, f=f: f(r).advantages for f in branches], rollout))
    step = learner.make_step(graphdef, advantage=advantage, objective=objective,
                             settings=settings)

    def update(state, u):
      models = nnx.merge(graphdef, state)
      batch = with_models(models, rollout(models["model"], jax.random.fold_in(key, u),
                                          mc_k=mc_k), actions, prm_beta=beta)
      if beta is not None:  # the PRM's step, taken in with_models
        state = nnx.state(models)
      state, metrics = step(state, batch, None, u)
      recorded = {"generated": jnp.sum(batch.mask, dtype=jnp.float32),
                  "continuations": continuation_tokens(batch.mask, mc_k, config.length),
                  **{name: metrics[name] for name in UPDATE_METRICS}}
      if isinstance(task, key_token.traceable.Traceable):  # every response has T actions
        recorded.update(filler_entropy=jnp.mean(batch.entropy[:, filler_columns]),
                        noisy_tokens=noisy_tokens(advantage(batch).advantages, batch.mask,
                                                  decisive_columns))
      elif isinstance(task, target_sum.traceable.Traceable):  # responses stop at EOS: their lengths
        recorded.update(zip(("length_correct", "length_incorrect"),
                            lengths_by_outcome(batch.mask, batch.rewards)))
        recorded["incorrect_share"] = jnp.mean(batch.rewards <= 0.5)
      return state, recorded

    def measure(state, start):
      measured = evaluate(state, jax.random.fold_in(jax.random.fold_in(key, EVAL_STREAM), start))
      if cell.mechanism_batches:
        measure_key = jax.random.fold_in(jax.random.fold_in(key, MECHANISM_STREAM), start)
        gradients = lambda: mechanism(nnx.merge(graphdef, state), advantage, measure_key, mc_k)
        # `start` is the same for every run: under vmap this stays a branch, so the
        # evaluations without measurements cost nothing.
        measured.update(jax.lax.cond(
            jnp.isin(start // cell.eval_every, jnp.asarray(cell.measured_evals)), gradients,
            lambda: {name: jnp.zeros(()) for name in MECHANISM + (RANKING if ranked else ())}))
      return measured

    def block(state, start):
      measured = measure(state, start)
      state, metrics = jax.lax.scan(update, state, start + jnp.arange(cell.eval_every))
      return state, (measured, metrics)

    starts = jnp.arange(0, cell.updates, cell.eval_every)
    state, (measured, metrics) = jax.lax.scan(block, state, starts)
    measured = jax.tree.map(lambda m, last: jnp.concatenate([m, last[None]]), measured,
                            measure(state, cell.updates))
    return measured, jax.tree.map(lambda m: m.reshape(-1), metrics)

  return run


class Runner:
  """The compiled program of a cell's runs (module docstring)."""

  def __init__(self, cell: Cell):
    self.cell = cell
    self._program = jax.jit(jax.vmap(make_run(cell)))
    self._compiled = {}  # width -> executable

  def train(self, runs: Sequence[tuple[int, float, int]], width: int | None = None) -> dict:
    """Trains `runs` [(arm index, learning rate, seed), ...] together, padded to `width`
    runs (repeating the last; the same width reuses the compiled program). Returns numpy
    arrays over the runs: "success" [N, n_evals] (exact J), "pass@k" {k: [N, n_evals]}, the
    per-update metrics [N, updates]; "updates" [n_evals] and "gen_tokens" [N, n_evals] (the
    response tokens each run generated before each measurement) and "charged_tokens" [N,
    n_evals] (those and its Monte-Carlo continuations'); the MECHANISM (and RANKING, with a
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
    compile_seconds = 0.0
    if width not in self._compiled:
      started = time.perf_counter()
      self._compiled[width] = self._program.lower(*arguments).compile()
      compile_seconds = time.perf_counter() - started
    started = time.perf_counter()
    measured, metrics = jax.block_until_ready(self._compiled[width](*arguments))
    run_seconds = time.perf_counter() - started
    kept = lambda x: np.asarray(x, np.float64)[:len(runs)]
    updates = np.arange(0, self.cell.updates + 1, self.cell.eval_every)
    pass_at = kept(measured["pass@k"])
    evals = list(self.cell.measured_evals)
    so_far = lambda per_update: np.concatenate(
        [np.zeros((len(runs), 1)), np.cumsum(per_update, axis=1)], axis=1)[:, updates]
    gen_tokens = so_far(kept(metrics["generated"]))
    charged = so_far(kept(metrics["generated"]) + kept(metrics["continuations"]))
    return {
        "success": kept(measured["success"]),
        "pass@k": {k: pass_at[..., i] for i, k in enumerate(self.cell.pass_at)},
        **{name: kept(measured[name])[:, evals] for name in MECHANISM + RANKING
           if evals and name in measured},
        "updates": updates,
        "gen_tokens": gen_tokens,
        "charged_tokens": charged,
        **({"mechanism_gen_tokens": gen_tokens[:, evals]} if evals else {}),
        **{name: kept(value) for name, value in metrics.items()
           if name not in ("generated", "continuations")},
        "compile_seconds": compile_seconds,
        "run_seconds": run_seconds,
    }
