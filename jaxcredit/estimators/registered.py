"""Registry adapters: every estimator as `fn(rollout, **hparams) -> Estimate`."""

import functools
from collections.abc import Callable

import jax.numpy as jnp

from jaxcredit._masking import as_bool, sanitise
from jaxcredit.estimators import (group, length_aware, returns, token_credit, tree_credit,
                                  turn_credit, value_credit)
from jaxcredit.registry import Registry
from jaxcredit.rollout import Estimate, Rollout

EstimatorFn = Callable[..., Estimate]


def _adapt(name: str, fn: Callable) -> EstimatorFn:
  """Validates the rollout and accepts a bare [B, T] array as the advantages."""

  @functools.wraps(fn)
  def estimator(rollout: Rollout, **hparams) -> Estimate:
    out = fn(rollout.check(), **hparams)
    return out if isinstance(out, Estimate) else Estimate(advantages=out)

  return estimator


REGISTRY: Registry[EstimatorFn] = Registry("estimator", wrap=_adapt)
get = REGISTRY.get
names = REGISTRY.names


def register(name: str, *, needs: tuple[str, ...] = (), settings: dict | None = None,
             overwrite: bool = False):
  """Decorator registering ``fn(rollout, **hparams) -> Estimate | [B, T]`` as `name`.

  The registered function is adapted to take a checked `Rollout` and to return an
  `Estimate`, so configs select it by name (`get`, `from_config`).

  Args:
    name: the estimator's name.
    needs: the rollout.extras keys it reads; before the learner step, the extras provider
      registered for each key computes it (`jaxcredit.credit.extras`).
    settings: ``{name: default}`` of the providers' own hyperparameters (e.g. the
      Monte-Carlo `k`), accepted in an advantage config beside the estimator's keyword
      arguments and handed to the providers.
    overwrite: replace an earlier registration of `name`.

  Returns:
    The decorator (it returns `fn` unchanged).

  Raises:
    ValueError: for a name already registered without `overwrite`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import jaxcredit as jc
    >>> @jc.estimators.register("doc_max_baseline")
    ... def max_baseline(rollout):
    ...   grouped = rollout.rewards.reshape(-1, rollout.group_size)
    ...   seq = (grouped - grouped.max(axis=1, keepdims=True)).reshape(-1)
    ...   return jc.estimators.broadcast_to_tokens(seq, rollout.mask)
    >>> rollout = jc.Rollout(tokens=jnp.zeros((2, 2), jnp.int32), mask=jnp.ones((2, 2), bool),
    ...                      rewards=jnp.array([1.0, 0.0]), group_size=2)
    >>> jc.estimators.get("doc_max_baseline")(rollout).advantages
    Array([[ 0.,  0.],
           [-1., -1.]], dtype=float32)
    >>> jc.estimators.REGISTRY.unregister("doc_max_baseline")
  """
  return REGISTRY.register(name, overwrite=overwrite, needs=tuple(needs),
                           settings=dict(settings or {}))


def token_level_rewards(rollout: Rollout) -> jnp.ndarray:
  """Per-token rewards: the outcome reward on each row's last action plus any dense
  ``rollout.token_rewards``.

  Args:
    rollout: a `Rollout`.

  Returns:
    float32 ``[B, T]``, 0 at masked positions.

  Examples:
    >>> from jaxcredit import demo, estimators
    >>> rollout = demo.sample_rollout()
    >>> estimators.token_level_rewards(rollout).sum(axis=1)  # the outcome reward of each row
    Array([1., 0., 0., 1., 1., 1., 1., 0.], dtype=float32)
  """
  rewards = group.outcome_to_tokens(rollout.rewards, rollout.mask)
  if rollout.token_rewards is not None:
    rewards += jnp.where(as_bool(rollout.mask), rollout.token_rewards, 0.0)
  return rewards


@register("grpo")
def _grpo(rollout: Rollout, *, eps: float = 1e-6, scale_by_std: bool = True):
  seq = group.grpo_advantages(
      rollout.rewards, group_size=rollout.group_size, eps=eps, scale_by_std=scale_by_std
  )
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("dr_grpo")
def _dr_grpo(rollout: Rollout):
  return _grpo(rollout, scale_by_std=False)


@register("grpo_batch_std")
def _grpo_batch_std(rollout: Rollout, *, eps: float = 1e-6):
  seq = group.grpo_batch_std_advantages(rollout.rewards, group_size=rollout.group_size, eps=eps)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("remax", needs=("baseline_rewards",))
def _remax(rollout: Rollout):
  """Needs rollout.extras["baseline_rewards"] [B]: rewards of greedy responses."""
  baseline = rollout.extra("baseline_rewards", by="remax", per="sequence")
  return group.broadcast_to_tokens(group.remax_advantages(rollout.rewards, baseline), rollout.mask)


@register("opo")
def _opo(rollout: Rollout):
  lengths = jnp.sum(as_bool(rollout.mask), axis=1)
  seq = length_aware.opo_advantages(rollout.rewards, lengths, group_size=rollout.group_size)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("pass_at_k")
def _pass_at_k(rollout: Rollout, *, k: int | None = None):
  """k defaults to max(1, group_size // 2); an explicit k > group_size raises."""
  k = max(1, rollout.group_size // 2) if k is None else k
  seq = group.pass_at_k_advantages(rollout.rewards, group_size=rollout.group_size, k=k)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("gpg")
def _gpg(rollout: Rollout, *, scale_by_std: bool = False):
  seq = group.gpg_advantages(
      rollout.rewards, group_size=rollout.group_size, scale_by_std=scale_by_std
  )
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("maxrl")
def _maxrl(rollout: Rollout):
  seq = group.maxrl_advantages(rollout.rewards, group_size=rollout.group_size)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("gdpo", needs=("reward_components",))
def _gdpo(rollout: Rollout, *, weights: tuple[float, ...] | None = None, eps: float = 1e-6):
  """Needs rollout.extras["reward_components"] [B, K]: each response's reward components."""
  components = rollout.extra("reward_components", by="gdpo", per="vector")
  seq = group.gdpo_advantages(components, group_size=rollout.group_size, weights=weights, eps=eps)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("lambda_grpo")
def _lambda_grpo(rollout: Rollout, *, lam: float = 1.0, r: float = 1.0, h_min: float = 1e-3,
                 eps: float = 1e-6):
  """lambda-GRPO with a fixed preference exponent `lam` (length_aware.lambda_grpo_advantages, the
  lengths counted on rollout.mask); lam = 0 is GRPO under token-mean aggregation."""
  lengths = jnp.sum(as_bool(rollout.mask), axis=1)
  seq = length_aware.lambda_grpo_advantages(rollout.rewards, lengths,
                                            group_size=rollout.group_size, lam=lam, r=r,
                                            h_min=h_min, eps=eps)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("lambda_grpo_learned", needs=("length_weights",),
          settings={"lam": 1.0, "r": 1.0, "lam_learning_rate": 0.01})
def _lambda_grpo_learned(rollout: Rollout, *, eps: float = 1e-6):
  """lambda-GRPO with a learnt exponent: GRPO's advantages times
  rollout.extras["length_weights"] [B], the weights under the lam its provider learns
  (credit.length_preference; settings lam, its start, r, and lam_learning_rate)."""
  weights = rollout.extra("length_weights", by="lambda_grpo_learned", per="sequence")
  seq = group.grpo_advantages(rollout.rewards, group_size=rollout.group_size, eps=eps)
  return group.broadcast_to_tokens(seq * weights.astype(jnp.float32), rollout.mask)


@register("rae", needs=("role_baselines",), settings={"decay": 0.95, "roles": 8})
def _rae(rollout: Rollout):
  """Role-conditioned advantage estimation (RAE): ``A = r - b_role`` on every token, with
  b_role an exponential moving average of the role's rewards over earlier batches
  (rollout.extras["role_baselines"] [B], its provider updating
  ``b <- decay b + (1 - decay) r_role``; one role without rollout.extras["roles"]).
  SPIRAL (Liu et al., 2025, arXiv 2506.24119)."""
  baselines = rollout.extra("role_baselines", by="rae", per="sequence")
  seq = rollout.rewards.astype(jnp.float32) - baselines.astype(jnp.float32)
  return group.broadcast_to_tokens(seq, rollout.mask)


def _tree(rollout: Rollout, by: str):
  """(path [B, S], segments [B, T]) of a tree rollout; ValueError naming `by` on a flat one."""
  if "tree_path" not in rollout.extras or "tree_segments" not in rollout.extras:
    raise ValueError(
        f"{by} needs a tree rollout: rollout.extras['tree_path'] and ['tree_segments'], which "
        "jaxcredit.sampling.sample_tree records (in the trainer: rollout.tree.fork = 'fixed' "
        f"or 'delimiter'); this rollout's extras are {sorted(rollout.extras)}.")
  return (rollout.extra("tree_path", by=by, per="vector"),
          rollout.extra("tree_segments", by=by))


@register("spo_tree")
def _spo_tree(rollout: Rollout):
  """V(n_k) - V(n_{k-1}) on segment k (`tree_credit.spo_tree_advantages`); needs a tree
  rollout (rollout.extras["tree_path"], ["tree_segments"])."""
  return tree_credit.spo_tree_advantages(rollout.rewards, *_tree(rollout, "spo_tree"),
                                         rollout.mask, group_size=rollout.group_size)


@register("treerl")
def _treerl(rollout: Rollout):
  """TreeRL's global plus local segment advantage (`tree_credit.treerl_advantages`); needs a
  tree rollout."""
  return tree_credit.treerl_advantages(rollout.rewards, *_tree(rollout, "treerl"), rollout.mask,
                                       group_size=rollout.group_size)


@register("tempo")
def _tempo(rollout: Rollout, *, eps: float = 1e-6):
  """GRPO plus the value step at each fork (`tree_credit.tempo_advantages`); needs a tree
  rollout."""
  return tree_credit.tempo_advantages(rollout.rewards, *_tree(rollout, "tempo"), rollout.mask,
                                      group_size=rollout.group_size, eps=eps)


@register("treepo")
def _treepo(rollout: Rollout, *, eps: float = 1e-8):
  """The reward relative to each subgroup sharing an ancestor, size-weighted and whitened
  (`tree_credit.treepo_advantages`); needs a tree rollout."""
  path, _ = _tree(rollout, "treepo")
  return tree_credit.treepo_advantages(rollout.rewards, path, rollout.mask,
                                       group_size=rollout.group_size, eps=eps)


@register("tree_grpo")
def _tree_grpo(rollout: Rollout, *, eps: float = 1e-6):
  """Intra-tree plus inter-tree normalised rewards (`tree_credit.tree_grpo_advantages`); needs
  a tree rollout."""
  path, _ = _tree(rollout, "tree_grpo")
  return tree_credit.tree_grpo_advantages(rollout.rewards, path, rollout.mask,
                                          group_size=rollout.group_size, eps=eps)


@register("rloo")
def _rloo(rollout: Rollout):
  seq = group.rloo_advantages(rollout.rewards, group_size=rollout.group_size)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("reinforce")
def _reinforce(rollout: Rollout, *, gamma: float = 1.0):
  ret = returns.discounted_returns(token_level_rewards(rollout), rollout.mask, gamma=gamma)
  return Estimate(advantages=ret, returns=ret)


@register("reinforce_pp")
def _reinforce_pp(rollout: Rollout, *, gamma: float = 1.0):
  """REINFORCE++ (Hu, 2025): batch-whitened discounted returns of the token
  rewards (outcome + any dense rewards such as a KL penalty)."""
  ret = returns.discounted_returns(token_level_rewards(rollout), rollout.mask, gamma=gamma)
  return Estimate(advantages=token_credit.whiten(ret, rollout.mask), returns=ret)


@register("reinforce_pp_baseline")
def _reinforce_pp_baseline(rollout: Rollout):
  """REINFORCE++-baseline (Hu, 2025): group-mean-centred outcome rewards,
  broadcast to tokens, then whitened over the batch."""
  centred = group.grpo_advantages(
      rollout.rewards, group_size=rollout.group_size, scale_by_std=False
  )
  return token_credit.whiten(group.broadcast_to_tokens(centred, rollout.mask), rollout.mask)


@register("otb", needs=("sum_pi_squared",))
def _otb(rollout: Rollout, *, gamma: float = 1.0, eps: float = 1e-8):
  """Optimal token baseline; needs rollout.behaviour_logprobs and
  rollout.extras["sum_pi_squared"] [B, T] (`logprobs.token_sum_probs_squared`)."""
  rollout.require("behaviour_logprobs", by="otb")
  ret = returns.discounted_returns(token_level_rewards(rollout), rollout.mask, gamma=gamma)
  advantages = token_credit.optimal_token_baseline_advantages(
      ret, rollout.behaviour_logprobs, rollout.extra("sum_pi_squared", by="otb"), rollout.mask,
      group_size=rollout.group_size, eps=eps,
  )
  return Estimate(advantages=advantages, returns=ret)


@register("prime", needs=("prm_logprobs",))
def _prime(rollout: Rollout, *, beta: float = 0.05, gamma: float = 1.0):
  """PRIME (Cui et al., 2025): RLOO on outcome rewards plus discounted returns
  of implicit process rewards beta (log pi_prm - log pi_ref), each centred by
  the leave-one-out mean of the other responses' per-token implicit reward.
  pi_prm is rollout.extras["prm_logprobs"] when present (the implicit PRM
  trained in the loop, `jaxcredit.credit.implicit_prm`), else rollout.behaviour_logprobs."""
  rollout.require("ref_logprobs", by="prime")
  if "prm_logprobs" in rollout.extras:
    prm_logp = rollout.extra("prm_logprobs", by="prime")
  else:
    rollout.require("behaviour_logprobs", by="prime (without extras['prm_logprobs'])")
    prm_logp = rollout.behaviour_logprobs
  valid = as_bool(rollout.mask)
  implicit = token_credit.implicit_process_rewards(prm_logp, rollout.ref_logprobs, valid, beta=beta)
  per_token = jnp.sum(implicit, 1) / jnp.maximum(jnp.sum(valid, 1), 1)
  others_mean = per_token - group.rloo_advantages(per_token, group_size=rollout.group_size)
  process = jnp.where(valid, implicit - others_mean[:, None], 0.0)
  outcome = group.broadcast_to_tokens(
      group.rloo_advantages(rollout.rewards, group_size=rollout.group_size), valid
  )
  return outcome + returns.discounted_returns(process, valid, gamma=gamma)


@register("grpo_high_entropy")
def _grpo_high_entropy(rollout: Rollout, *, rho: float = 0.2, eps: float = 1e-6):
  """GRPO advantages on the top-rho entropy tokens only (Wang et al., 2025);
  needs rollout.entropy."""
  rollout.require("entropy", by="grpo_high_entropy")
  keep = token_credit.high_entropy_mask(rollout.entropy, rollout.mask, rho=rho)
  return jnp.where(keep, _grpo(rollout, eps=eps), 0.0)


@register("grpo_surprisal")
def _grpo_surprisal(rollout: Rollout, *, eps: float = 1e-6):
  """GRPO advantages times surprisal weights (mean 1); needs rollout.behaviour_logprobs."""
  rollout.require("behaviour_logprobs", by="grpo_surprisal")
  return _grpo(rollout, eps=eps) * token_credit.surprisal_weights(rollout.behaviour_logprobs,
                                                                  rollout.mask)


@register("n_step")
def _n_step(rollout: Rollout, *, n: int = 8, gamma: float = 1.0, method: str | None = None):
  """A_t = G^(n)_t - V_t with n-step bootstrapped returns; needs rollout.values."""
  rollout.require("values", by="n_step")
  ret = returns.n_step_returns(
      token_level_rewards(rollout), rollout.values, rollout.mask, n=n, gamma=gamma, method=method
  )
  valid = as_bool(rollout.mask)
  return Estimate(advantages=jnp.where(valid, ret - rollout.values, 0.0), returns=ret)


@register("vtrace", needs=("target_logprobs",))
def _vtrace(rollout: Rollout, *, gamma: float = 1.0, lam: float = 1.0, clip_rho: float = 1.0,
            clip_c: float = 1.0, method: str | None = None):
  """V-trace for off-policy (asynchronous) batches: rollout.behaviour_logprobs is the
  behaviour policy, rollout.extras["target_logprobs"] the learner policy."""
  rollout.require("behaviour_logprobs", "values", by="vtrace")
  log_rhos = rollout.extra("target_logprobs", by="vtrace") - rollout.behaviour_logprobs
  vs, pg_advantages = returns.vtrace(
      token_level_rewards(rollout), rollout.values, rollout.mask, log_rhos,
      gamma=gamma, lam=lam, clip_rho=clip_rho, clip_c=clip_c, method=method,
  )
  return Estimate(advantages=pg_advantages, returns=vs)


@register("gae")
def _gae(rollout: Rollout, *, gamma: float = 1.0, lam: float = 0.95, method: str | None = None):
  rollout.require("values", by="gae")
  advantages, rets = returns.gae(
      token_level_rewards(rollout), rollout.values, rollout.mask,
      gamma=gamma, lam=lam, method=method,
  )
  return Estimate(advantages=advantages, returns=rets)


MC_VALUES = ("mc_values", "mc_evaluated")


@register("vineppo", needs=MC_VALUES, settings={"k": 4, "positions": "all"})
def _vineppo(rollout: Rollout):
  """VinePPO (Kazemnejad et al., 2024, arXiv 2410.01679): Monte-Carlo values
  V(s_t) at the positions in extras["mc_evaluated"] (extras["mc_values"], from
  `k` rollouts per position at `positions`, see
  `jaxcredit.credit.monte_carlo`); each segment's V(next point) - V(point) is
  copied to its tokens."""
  return value_credit.segment_advantages(
      rollout.extra("mc_values", by="vineppo"), rollout.extra("mc_evaluated", by="vineppo"),
      rollout.rewards, rollout.mask)


@register("oracle", needs=("oracle_advantages",))
def _oracle(rollout: Rollout):
  """Exact token credit A(s_t, y_t) from extras["oracle_advantages"] (the lab's
  exact oracles, e.g. `jaxcredit.tasks.key_token.oracle.decisive_credit`)."""
  return jnp.where(as_bool(rollout.mask), rollout.extra("oracle_advantages", by="oracle"), 0.0)


@register("oracle_shuffled", needs=("oracle_advantages", "shuffle_priorities"))
def _oracle_shuffled(rollout: Rollout):
  """The exact token credit of each response permuted at random over its own actions
  (the lab's control of `oracle`: the same magnitudes and sum per response, no
  localisation). extras["shuffle_priorities"] [B, T] in [0, 1) draws the permutation:
  the i-th action in position order receives the credit of the action with the i-th
  smallest priority."""
  valid = as_bool(rollout.mask)
  credit = jnp.where(valid, rollout.extra("oracle_advantages", by="oracle_shuffled"), 0.0)
  priorities = rollout.extra("shuffle_priorities", by="oracle_shuffled")
  columns = jnp.arange(valid.shape[1])
  source = jnp.argsort(jnp.where(valid, priorities, 2.0), axis=1)  # actions first, shuffled
  target = jnp.argsort(jnp.where(valid, columns, valid.shape[1] + columns), axis=1)  # in order
  rows = jnp.arange(valid.shape[0])[:, None]
  return jnp.zeros_like(credit).at[rows, target].set(jnp.take_along_axis(credit, source, 1))


@register("oracle_seq", needs=("oracle_values",))
def _oracle_seq(rollout: Rollout):
  """R - V(x) on every token, V from extras["oracle_values"]: the exact
  sequence-level baseline with no localisation (the lab's control)."""
  return value_credit.sequence_advantages(rollout.extra("oracle_values", by="oracle_seq"),
                                          rollout.rewards, rollout.mask)


@register("spo", needs=MC_VALUES, settings={"k": 4, "positions": "cutpoints:0.9"})
def _spo(rollout: Rollout, *, prob_threshold: float = 0.9):
  """SPO-chain (Guo et al., 2025, arXiv 2505.23564): segments start at cutpoints
  (tokens with pi(y_t) < 0.9), each segment's Monte-Carlo V(next cutpoint) -
  V(cutpoint) is carried back over its tokens (extras["mc_values"] /
  ["mc_evaluated"], as for vineppo), and the probability mask zeroes the
  credit of confident tokens (pi(y_t) > prob_threshold)."""
  rollout.require("behaviour_logprobs", by="spo")
  credit = _vineppo(rollout)
  confident = jnp.exp(sanitise(rollout.behaviour_logprobs, as_bool(rollout.mask))) > prob_threshold
  return jnp.where(confident, 0.0, credit)


@register("ktae", needs=("ktae_scores",))
def _ktae(rollout: Rollout, *, eps: float = 1e-6):
  """KTAE (arXiv 2505.16826): the GRPO advantage plus a per-group key-token score
  kappa of each token's type, extras["ktae_scores"] [B, T]
  (`jaxcredit.credit.token_statistics.ktae_scores`: Fisher's exact test and
  information gain of the token's presence against correctness, signed by
  Cohen's h)."""
  scores = rollout.extra("ktae_scores", by="ktae")
  valid = as_bool(rollout.mask)
  return _grpo(rollout, eps=eps) + jnp.where(valid, sanitise(scores, valid), 0.0)


def _turns(rollout: Rollout, by: str) -> tuple:
  """(turn_rewards [B, T], turn_ids [B, T]) of a multi-turn rollout
  (`rollout_sources.MultiTurn`)."""
  rollout.require("turn_ids", by=by)
  return rollout.extra("turn_rewards", by=by), rollout.turn_ids


@register("turn_gae")
def _turn_gae(rollout: Rollout, *, gamma: float = 1.0, lam: float = 0.95,
              method: str | None = None):
  """GAE over turns with a turn critic (`turn_credit.turn_gae`): rollout.values at each
  turn's first action, extras["turn_rewards"], rollout.turn_ids."""
  rollout.require("values", by="turn_gae")
  turn_rewards, turn_ids = _turns(rollout, "turn_gae")
  advantages, rets = turn_credit.turn_gae(turn_rewards, rollout.values, turn_ids, rollout.mask,
                                          gamma=gamma, lam=lam, method=method)
  return Estimate(advantages=advantages, returns=rets)


@register("mt_grpo")
def _mt_grpo(rollout: Rollout, *, outcome_coef: float = 1.0, eps: float = 1e-6,
             scale_by_std: bool = True):
  """MT-GRPO (`turn_credit.mt_grpo_advantages`): group-normalised turn rewards
  (extras["turn_rewards"]) plus outcome_coef times the GRPO advantage of rollout.rewards."""
  turn_rewards, turn_ids = _turns(rollout, "mt_grpo")
  return turn_credit.mt_grpo_advantages(turn_rewards, rollout.rewards, turn_ids, rollout.mask,
                                        group_size=rollout.group_size, outcome_coef=outcome_coef,
                                        eps=eps, scale_by_std=scale_by_std)


@register("gigpo")
def _gigpo(rollout: Rollout, *, step_coef: float = 1.0, gamma: float = 0.95, eps: float = 1e-6,
           scale_by_std: bool = True):
  """GiGPO (`turn_credit.gigpo_advantages`): the episode group's GRPO advantage plus
  step_coef times the step group's, step groups by extras["turn_anchors"] (the
  environment state at each turn's start, `rollout_sources.MultiTurn`)."""
  turn_rewards, turn_ids = _turns(rollout, "gigpo")
  return turn_credit.gigpo_advantages(
      turn_rewards, rollout.rewards, rollout.extra("turn_anchors", by="gigpo"), turn_ids,
      rollout.mask, group_size=rollout.group_size, step_coef=step_coef, gamma=gamma, eps=eps,
      scale_by_std=scale_by_std)


@register("turn_vine", needs=("turn_baselines",), settings={"k": 4})
def _turn_vine(rollout: Rollout):
  """VinePPO over turns: A_k = r_k + V(h_(k+1)) - V(h_k), each turn-start value V(h_k) the
  mean reward from turn k on of `k` continuations branched from the turn's start
  (extras["turn_baselines"], `rollout_sources.MultiTurn.returns_to_go`; V = 0 after the last
  turn): TD(0) over turns on Monte-Carlo values (`turn_credit.turn_gae` with lam = 0).
  An unbiased estimate of the exact turn credit for any k; with many continuations, the
  lab's Monte-Carlo turn oracle where no exact one exists."""
  turn_rewards, turn_ids = _turns(rollout, "turn_vine")
  advantages, _ = turn_credit.turn_gae(
      turn_rewards, rollout.extra("turn_baselines", by="turn_vine"), turn_ids, rollout.mask,
      gamma=1.0, lam=0.0)
  return advantages


@register("turn_baseline", needs=("turn_baselines",), settings={"k": 4})
def _turn_baseline(rollout: Rollout):
  """The rewards from each turn on minus extras["turn_baselines"]: the mean of `k`
  continuations branched from the turn's start (`turn_credit.turn_baseline_advantages`,
  `rollout_sources.MultiTurn.returns_to_go`), an unbiased per-turn baseline."""
  turn_rewards, turn_ids = _turns(rollout, "turn_baseline")
  return turn_credit.turn_baseline_advantages(
      turn_rewards, rollout.extra("turn_baselines", by="turn_baseline"), turn_ids, rollout.mask)
